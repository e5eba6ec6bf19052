"""ZeroMQ bridge between the trainer and the evaluator fleet. Depends on pyzmq and msgpack only."""

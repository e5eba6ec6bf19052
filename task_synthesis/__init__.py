"""Training tasks at scale: seed operators, compositions, execution filtering, decontamination.

The pipeline (docs/task-synthesis.md): a catalogue of seed operators crawled from the installed
torch (plus transformers-style blocks in plain torch), a shape-aware composer that stacks up to
five of them into one `Model` (rendered, or written by an LLM from the same draw), a static
screen of each source, an execution filter that runs each candidate in a worker and then
through the evaluator's own reference self-check in isolated children, near-duplicate removal
and decontamination by normalised-AST similarity, and a parquet file in the Ops-6K layout.
"""

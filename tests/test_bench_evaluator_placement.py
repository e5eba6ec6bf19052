"""The placement probe's ways of preparing a call and of getting its input set
(scripts/evaluator_bench/placement.py), dry on the CPU."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("scripts_on_path")


def _placement():
    from evaluator_bench import placement

    return placement


def test_each_way_gives_a_median_per_way(capsys):
    from evaluator_bench.report import Clock

    placement = _placement()
    rows = placement._path_rows(Clock(), "6_Swish", rounds=2, device="cpu")
    assert [row["path"] for row in rows] == ["baseline", "baseline, copies kept", "baseline, one poison", "candidate"]
    assert all(row["n"] == 20 and min(row["median_us"], row["even_us"], row["odd_us"]) > 0 for row in rows)
    assert rows[0]["ratio"] == 1.0
    placement._print_paths(rows)
    assert "candidate" in capsys.readouterr().out


def test_the_candidates_way_frees_the_last_calls_tensors_before_copying_and_poisons_output_sized_blocks():
    model = torch.nn.ReLU()
    x = torch.randn(8, 16)
    way = _placement()._CandidateWay(model, [x], "cpu")
    way.prepare(0)
    first = way()
    assert torch.equal(first, torch.relu(x))
    assert way.args[0] is not way.kept[0] and torch.equal(way.args[0], x)
    way.prepare(1)
    assert way.output is None and way.block_sizes == [first.numel() * first.element_size()]
    assert torch.equal(way(), torch.relu(x))


def test_the_copies_kept_baseline_copies_while_the_last_copies_are_held(monkeypatch):
    """The way before the baselines freed first: the copies alive while the new ones are made."""
    from evaluator_cuda.roles.reference import CandidateLikeCalls

    calls = CandidateLikeCalls(torch.nn.ReLU(), [torch.randn(4, 4)], "cpu")
    kept = _placement()._CopiesKept(calls)
    kept.prepare(0)
    out = kept()
    alive_while_copying = []
    clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: (alive_while_copying.append(len(calls.args)),
                                                                    clone(t, *a, **k))[1])
    kept.prepare(1)
    monkeypatch.undo()
    assert alive_while_copying == [1] and calls.output is None
    assert torch.equal(out, torch.relu(calls.inputs[0])) and torch.equal(kept(), out)


def test_the_one_poison_baseline_poisons_every_call_with_the_same_pattern(monkeypatch):
    from evaluator_cuda.roles.reference import CandidateLikeCalls
    from evaluator_cuda.timing import profile

    parities = []
    poison = profile.poison_allocator
    monkeypatch.setattr(profile, "poison_allocator",
                        lambda sizes, parity, device: (parities.append(parity), poison(sizes, parity, device))[1])
    x = torch.randn(4, 4)
    one, both = (way(CandidateLikeCalls(torch.nn.ReLU(), [x], "cpu")) for way in (_placement()._OnePoison, lambda c: c))
    for position in range(4):
        one.prepare(position)
        assert torch.equal(one(), torch.relu(x))
    for position in range(4):
        both.prepare(position)
        both()
    assert parities == [0, 0, 0, 0, 0, 1, 0, 1]


def test_the_set_ways_give_a_median_each(capsys):
    from evaluator_bench.report import Clock

    placement = _placement()
    rows = placement._set_rows(Clock(), "9_Sum_reduction_over_a_dimension", rounds=2, device="cpu")
    assert [row["path"] for row in rows] == ["baseline", "baseline, made per call", "candidate, sent per call",
                                             "candidate, made per call"]
    assert all(row["n"] == 20 and row["median_us"] > 0 for row in rows) and rows[0]["ratio"] == 1.0
    placement._print_paths(rows)
    assert "candidate, made per call" in capsys.readouterr().out


def test_a_candidate_way_with_a_set_maker_takes_a_new_set_for_each_call_after_freeing_the_last():
    from evaluator_cuda.roles.inputs import inputs_from_seed

    seeds = iter([11, 12])
    made = []

    def make():
        made.append(inputs_from_seed("t", lambda: [torch.randn(4, 4)], next(seeds), on_device=False))
        return made[-1]

    way = _placement()._CandidateWay(torch.nn.ReLU(), [torch.zeros(4, 4)], "cpu", make)
    way.prepare(0)
    first = way()
    assert way.pristine is made[0] and torch.equal(first, torch.relu(made[0][0]))
    way.prepare(1)
    assert way.pristine is made[1] and not torch.equal(made[0][0], made[1][0])
    torch.manual_seed(12)
    assert torch.equal(way.args[0], torch.randn(4, 4)) and way.args[0] is not made[1][0]

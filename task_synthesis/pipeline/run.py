"""The synthesis run: draft, screen, check similarity, filter by execution in worker processes, keep.

The parent drafts each candidate from its own seed (compose/drafts.py: the programmatic composer
renders its plan at once; the LLM composer's drafts are written by a model on background
threads), screens its source statically (filter/screen.py: the source is parsed, never run
here), drops it when it is too similar to an evaluation program (decontamination) or to a task
already kept (near-duplicate), and hands the rest to the filter's workers (filter/pool.py:
long-lived processes, each in its own jail, running filter/worker.py on one candidate at a time;
the run alone writes the journal and treats their verdicts as untrusted data). Candidates are
drawn for the category furthest below its quota (quotas.py), so the kept set follows the target
composition whichever composer writes them. Every decision goes to the journal before the next
one; a resumed run replays the journal.

Two verdicts are not decisions yet (second_tries.py): a candidate that ran out of GPU memory is
put back and tried again once as many candidates as there are workers were decided since (at
most `oom_retries` times, then rejected at `gpu_memory`), and a programmatic candidate whose eager
forward ran below the window is drawn again with its batch multiplied, under a derived name
(`synth_2op_00017_x16`) and the same key. Either way the candidate is journaled once, with its
final verdict, the GPU retries it took and its batch factor; one in flight or waiting at a crash
is drawn again on resume like any other.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import hashlib
import time
from pathlib import Path

from ..catalogue import store
from ..catalogue.families import ShapeError
from ..compose.chat_client import ChatSettings, EndpointError
from ..compose.drafts import DraftRejected, ProgrammaticComposer, start_draft
from ..config import SynthesisConfig
from ..filter.execution import Rejected
from ..filter.launch import Launcher, WorkerLimits, evaluator_inside, jail_problem
from ..filter.pool import WorkerPool
from ..filter.screen import screen
from ..similarity.score import SimilarityIndex, fingerprint
from .journal import Journal, journal_path
from .quotas import quotas
from .second_tries import Requeue, activation_bytes, batch_factor
from .stopping import POLL_S, StopRequests


class Stopped(RuntimeError):
    """The run was stopped (SIGTERM or Ctrl-C); what was decided is in the journal."""


class SynthesisError(ValueError):
    """Bad input to a run (no such folder, an unusable count); str() is one line."""


@dataclasses.dataclass
class RunOptions:
    out: Path
    count: int
    config: SynthesisConfig
    seed: int = 0
    workers: int = 2
    backend: str = "host"
    eval_dir: Path | None = None
    catalogue: Path | None = None
    cache_dir: str | None = None
    llm: ChatSettings | None = None  # the LLM composer's endpoint (None: the programmatic composer)
    unjailed_workers: bool = False  # run the filter's workers without the jail (see filter/launch.py)
    worker_limits: WorkerLimits | None = None  # None: WorkerLimits.for_backend(backend)
    skip_screen_for_tests_only: bool = False  # candidates reach the workers unscreened: for tests of the jail


def workers_jailed(options: RunOptions) -> tuple[bool, str | None]:
    """(whether the filter's workers run in the jail, a line to show the user or None). A model's code runs
    only in jailed workers unless the run opts out; where the jail cannot be built, the programmatic
    composer's tasks (our own code) run in plain workers."""
    if options.unjailed_workers:
        return False, ("warning: --unjailed-workers: the model's code runs unjailed, as this user"
                       if options.llm is not None else None)
    problem = jail_problem()
    if problem is None:
        return True, None
    if options.llm is not None:
        raise SynthesisError(f"--composer llm runs a model's code only in jailed workers, and the jail cannot be "
                             f"built here ({problem}); --unjailed-workers runs it unjailed")
    return False, f"note: the filter's workers run unjailed: the jail cannot be built here ({problem})"


def candidate_seed(seed: int, category: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{category}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def task_name(category: str, index: int) -> str:
    return f"synth_{category}_{index:05d}" if category == "transformers" else f"synth_{category}op_{index:05d}"


def load_eval_index(eval_dir: Path | None) -> SimilarityIndex:
    index = SimilarityIndex()
    if eval_dir is None:
        return index
    from evaluator_cuda.tasks import load_tasks

    if not Path(eval_dir).exists():
        raise SynthesisError(f"no such evaluation folder: {eval_dir}")
    for task in load_tasks(eval_dir).tasks:
        try:
            index.add(task.name, task.source)
        except SyntaxError:
            continue
    if not len(index):
        raise SynthesisError(f"no evaluation programs found in {eval_dir}")
    return index


class Synthesis:
    def __init__(self, options: RunOptions, progress=print):
        if options.count < 1:
            raise SynthesisError("--count must be at least 1")
        if options.workers < 1:
            raise SynthesisError("--workers must be at least 1")
        if options.out.suffix != ".parquet":
            raise SynthesisError(f"--out must name a .parquet file, got {options.out}")
        _check_backend(options.backend)
        self.o, self.say = options, progress
        self.jailed, self.jail_note = workers_jailed(options)
        self.limits = options.worker_limits or WorkerLimits.for_backend(options.backend)
        self.operators = store.load(options.catalogue)["operators"]
        self.composer = _composer(options, self.operators)
        self.eval_index = load_eval_index(options.eval_dir)
        self.quotas = quotas(options.count, options.config.composition)
        self.journal = Journal(journal_path(options.out), self._settings())
        self.kept_index = SimilarityIndex()
        self.kept = {c: 0 for c in self.quotas}
        self.tried = {c: 0 for c in self.quotas}
        self.done: set[str] = set()
        self.next_index = {c: 0 for c in self.quotas}
        self.jobs: dict[str, dict] = {}  # key -> the job of a candidate in the filter or waiting to be tried again
        self.requeue = Requeue(delay=options.workers)
        self.began = time.monotonic()
        self._replay()
        self.kept_before = sum(self.kept.values())  # kept by earlier sessions of a resumed run

    def _settings(self) -> dict:
        return run_settings(self.o, self.eval_index.names)

    def journal_settings(self) -> dict:
        return self._settings()

    def _replay(self) -> None:
        for entry in self.journal.entries:
            self._count(entry)
        if self.journal.entries:
            self.say(f"resuming: {sum(self.kept.values())} kept of {len(self.journal.entries)} candidates decided")

    def _count(self, entry: dict) -> None:
        self.done.add(entry["key"])
        self.tried[entry["category"]] += 1
        if entry["status"] == "kept":
            self.kept[entry["category"]] += 1
            self.kept_index.add(entry["name"], entry["source"])

    # --- choosing and screening candidates ------------------------------------------------------

    def _deficits(self, in_flight: dict) -> list[str]:
        """Categories still short of their quota (counting candidates in flight), furthest below first."""
        budget = self.o.config.attempts_per_task
        open_ = [c for c in self.quotas if self.kept[c] + in_flight.get(c, 0) < self.quotas[c]
                 and self.tried[c] < budget * max(1, self.quotas[c])]
        return sorted(open_, key=lambda c: (self.kept[c] + in_flight.get(c, 0)) / self.quotas[c])

    def _next_key(self, category: str) -> tuple[str, int]:
        while f"{category}:{self.next_index[category]}" in self.done:
            self.next_index[category] += 1
        index = self.next_index[category]
        self.next_index[category] += 1
        return f"{category}:{index}", index

    def _start(self, category: str) -> tuple[dict, futures.Future]:
        """(journal entry so far, future of its draft)."""
        key, index = self._next_key(category)
        seed = candidate_seed(self.o.seed, category, index)
        entry = {"key": key, "category": category, "index": index, "seed": seed, "name": task_name(category, index)}
        if self.composer.name != "programmatic":
            entry["composer"] = self.composer.name
        return entry, start_draft(self.composer, category, seed)

    def _drafted(self, entry: dict, future: futures.Future) -> tuple[dict, dict | None]:
        """(journal entry, worker job or None when screened out already)."""
        try:
            draft = future.result()
        except EndpointError:
            raise
        except DraftRejected as exc:
            return {**entry, "status": "rejected", "stage": exc.stage, "reason": exc.reason, "reply": exc.reply}, None
        except Exception as exc:
            return {**entry, "status": "rejected", "stage": "compose", "reason": str(exc)[:200]}, None
        return self._screen_draft(entry, draft)

    def _screen_draft(self, entry: dict, draft) -> tuple[dict, dict | None]:
        plan, source = draft.plan, draft.source
        entry = {**entry, "ops": plan.ops, "input_shape": plan.input_shape, "output_shape": plan.output_shape,
                 "source": source}
        try:
            if not self.o.skip_screen_for_tests_only:
                screen(source)
        except Rejected as exc:
            return {**entry, "status": "rejected", "stage": exc.stage, "reason": exc.reason}, None
        return self._similar(entry, plan)

    def _similar(self, entry: dict, plan) -> tuple[dict, dict | None]:
        """Decontamination and near-duplicates; then the worker job."""
        fp = fingerprint(entry["source"])
        threshold = self.o.config.similarity_threshold
        entry["eval_similarity"], entry["eval_nearest"] = self.eval_index.nearest(fp)
        if entry["eval_similarity"] >= threshold:
            return {**entry, "status": "rejected", "stage": "decontaminate",
                    "reason": f"similarity {entry['eval_similarity']:.2f} to {entry['eval_nearest']}"}, None
        reason = self._near_duplicate(fp)
        if reason:
            return {**entry, "status": "rejected", "stage": "duplicate", "reason": reason}, None
        return entry, self._job(entry, plan)

    def _near_duplicate(self, fp) -> str | None:
        """Why the program of fingerprint `fp` is a near-duplicate of a kept task, or None."""
        near, name = self.kept_index.nearest(fp, at_least=self.o.config.duplicate_threshold)
        return f"similarity {near:.2f} to {name}" if near >= self.o.config.duplicate_threshold else None

    def _job(self, entry: dict, plan) -> dict:
        job = {"key": entry["key"], "name": entry["name"], "source": entry["source"],
               "expected_shape": plan.output_shape, "shapes": plan.shapes(),
               "window_ms": self.o.config.window(self.o.backend), "memory_bytes": self.o.config.memory_bytes,
               "evaluator": self._evaluator_settings(), "device": "cuda" if self.o.backend == "cuda" else "cpu"}
        if entry.get("composer"):  # written by a model: it must also take the input it was asked to take
            job["input_shapes"] = [plan.input_shape]
        return job

    def _evaluator_settings(self) -> dict | None:
        if not self.o.config.evaluator:
            return None
        from ..filter.evaluator_stage import evaluator_settings

        settings = evaluator_settings(self.o.backend, self.o.config.compile, self.o.cache_dir,
                                      self.o.config.evaluation_for(self.o.backend))
        return evaluator_inside(settings, self.limits) if self.jailed else settings

    # --- deciding -------------------------------------------------------------------------------

    def _verdict(self, filtering: dict, entry: dict, result: dict) -> None:
        """A worker's verdict: the candidate is tried again later (out of GPU memory), drawn again with a larger
        batch (below the window), or decided."""
        if result["status"] == "retry":
            self._retry(entry, result)
            return
        scaled = self._scale_up(entry, result)
        if scaled is not None:
            self._submit_or_decide(filtering, *scaled)
        else:
            self._decide(entry, result)

    def _retry(self, entry: dict, result: dict) -> None:
        """Put a candidate that ran out of GPU memory back, or reject it at `gpu_memory` after `oom_retries`."""
        tries = entry.get("gpu_retries", 0)
        if tries >= self.o.config.oom_retries:
            reason = f"out of GPU memory in {tries + 1} tries; the last: {result['reason']}"
            final = {"status": "rejected", "stage": "gpu_memory", "reason": reason[:1000]}
            self._decide(entry, {**final, **({"filter_s": result["filter_s"]} if "filter_s" in result else {})})
            return
        entry = {**entry, "gpu_retries": tries + 1}
        self.requeue.put(entry, self.jobs[entry["key"]], len(self.journal.entries))
        self.say(f"{self._progress()} {entry['name']} out of GPU memory, tried again later "
                 f"({tries + 1} of {self.o.config.oom_retries}): {result['reason'][:80]}")

    def _scale_up(self, entry: dict, result: dict) -> tuple[dict, dict | None] | None:
        """(entry, job or None) of the same draw with its batch multiplied, for a programmatic candidate whose
        eager forward ran below the window (once); None for any other verdict."""
        low = self.o.config.window(self.o.backend)[0]
        eager_ms = result.get("eager_ms") or 0.0
        if self.composer.name != "programmatic" or entry.get("batch_factor") or result["stage"] != "window" \
                or not 0 < eager_ms < low:
            return None
        job = self.jobs[entry["key"]]
        activations = activation_bytes(job["shapes"])
        factor = batch_factor(eager_ms, low, self.o.config.batch_scale_max, result.get("bytes") or activations,
                              activations, job["memory_bytes"])
        try:
            draft = self.composer.draft(entry["category"], entry["seed"], factor) if factor > 1 else None
        except ShapeError:  # not expected (the same draws fall the same way): the verdict stands
            draft = None
        if draft is None:
            return None
        scaled = {**entry, "name": f"{task_name(entry['category'], entry['index'])}_x{factor}",
                  "batch_factor": factor, "unscaled_eager_ms": eager_ms}
        self.say(f"{self._progress()} {entry['name']} eager {eager_ms:.3g} ms below the window: scaled batch "
                 f"{entry['input_shape'][0]} -> {draft.plan.input_shape[0]} as {scaled['name']}")
        return self._screen_draft(scaled, draft)

    def _decide(self, entry: dict, result: dict | None) -> None:
        self.jobs.pop(entry["key"], None)
        if result is not None:
            entry = {**entry, **{k: v for k, v in result.items() if k != "key"}}
            if entry["status"] == "kept":  # a sibling kept while this one ran may be its near-duplicate
                reason = self._near_duplicate(fingerprint(entry["source"]))
                if reason:
                    entry.update(status="rejected", stage="duplicate", reason=reason)
        if entry["status"] != "kept" and not entry.get("composer"):
            entry.pop("source", None)  # the seed gives it again; the journal stays small (a model's reply is kept)
        self.journal.add(entry)
        self._count(entry)
        self._report_progress(entry)

    def kept_this_session(self) -> int:
        return sum(self.kept.values()) - self.kept_before

    def _progress(self) -> str:
        kept, decided = sum(self.kept.values()), len(self.journal.entries)
        hours = max(1e-9, (time.monotonic() - self.began) / 3600)
        return f"[{kept}/{self.o.count} kept, {decided} tried, {self.kept_this_session() / hours:.0f} kept/h]"

    def _report_progress(self, entry: dict) -> None:
        what = "kept" if entry["status"] == "kept" else f"rejected at {entry['stage']}: {entry['reason'][:80]}"
        self.say(f"{self._progress()} {entry['name']} {what}")

    def run(self) -> dict:
        """Synthesise until every quota is met or its attempts are spent; returns the kept count per category.
        SIGTERM or Ctrl-C stops the workers (and the evaluator's children under them) and raises Stopped;
        an LLM endpoint that cannot answer stops them too and raises EndpointError, workers that cannot
        start WorkersCannotStart. The journal keeps every decision, so running again resumes."""
        drafting: dict = {}  # future of a draft -> entry
        filtering: dict = {}  # future of a worker's verdict -> entry
        self.pool = WorkerPool(Launcher(self.o.backend, self.jailed, self.limits), self.o.workers)
        try:
            with StopRequests() as stop:
                self._loop(drafting, filtering, stop)
        except Stopped:
            self.pool.stop()
            lost = len(drafting) + len(filtering) + len(self.requeue)
            raise Stopped(f"stopped with {len(self.journal.entries)} candidates decided; "
                          f"{lost} in flight are lost, run the same command to resume") from None
        except BaseException:  # EndpointError, WorkersCannotStart, or a fault of the run: no worker outlives it
            self.pool.stop()
            raise
        self.pool.close()
        return dict(self.kept)

    def _open_categories(self, drafting: dict, filtering: dict) -> list[str]:
        counts: dict = {}
        for entry in [*drafting.values(), *filtering.values(), *self.requeue.entries()]:
            counts[entry["category"]] = counts.get(entry["category"], 0) + 1
        return self._deficits(counts)

    def _room(self, drafting: dict, filtering: dict) -> bool:
        """A new draft may start: the workers' share plus the composer's drafts in flight leave room."""
        concurrency = self.composer.concurrency
        return len(drafting) + len(filtering) < self.o.workers + concurrency and len(drafting) < max(1, concurrency)

    def _loop(self, drafting: dict, filtering: dict, stop: StopRequests) -> None:
        """Draft candidates while quotas are open and there is room; screen each draft as it is made, hand
        it to a worker, decide each as its worker finishes (or put it back, or draw it again scaled up).
        Raises Stopped at the first step after a stop is requested."""
        while True:
            if stop.requested:
                raise Stopped(stop.requested)
            if self._room(drafting, filtering) and self._start_one(drafting, filtering):
                continue
            if not drafting and not filtering:
                break
            finished, _ = futures.wait([*drafting, *filtering], POLL_S, return_when=futures.FIRST_COMPLETED)
            for future in [f for f in [*drafting, *filtering] if f in finished]:  # in the order they started
                if future in drafting:
                    self._screened(filtering, drafting.pop(future), future)
                else:
                    entry = filtering.pop(future)
                    self._verdict(filtering, entry, future.result())  # or a `worker` rejection (filter/pool.py)

    def _start_one(self, drafting: dict, filtering: dict) -> bool:
        """Hand a worker a candidate due to be tried again, else start a draft; False when there is neither
        (a candidate waiting to be tried again goes at once when nothing else would start)."""
        open_ = self._open_categories(drafting, filtering)
        again = self.requeue.take(len(self.journal.entries), force=not open_ or not (drafting or filtering))
        if again is not None:
            entry, job = again
            filtering[self.pool.submit(job)] = entry
            return True
        if not open_:
            return False
        entry, future = self._start(open_[0])
        if future.done():  # a programmatic draft: screened at once, in a reproducible order
            self._screened(filtering, entry, future)
        else:
            drafting[future] = entry
        return True

    def _screened(self, filtering: dict, entry: dict, future) -> None:
        self._submit_or_decide(filtering, *self._drafted(entry, future))

    def _submit_or_decide(self, filtering: dict, entry: dict, job: dict | None) -> None:
        if job is None:
            self._decide(entry, None)
        else:
            self.jobs[entry["key"]] = job
            filtering[self.pool.submit(job)] = entry


def run_settings(options: RunOptions, eval_names, gpu_names: list[str] | None = None) -> dict:
    """What a journal is keyed by: a resume must match it exactly (the count may grow). `gpu_names`:
    the GPUs a cuda run is on (None: read from the driver)."""
    catalogue = Path(options.catalogue or store.DEFAULT_PATH).read_bytes()
    settings = {"config": options.config.to_dict(), "seed": options.seed, "backend": options.backend,
                "catalogue_sha256": hashlib.sha256(catalogue).hexdigest()[:16],
                "eval_programs_sha256": hashlib.sha256("\n".join(sorted(eval_names)).encode()).hexdigest()[:16]}
    if options.backend == "cuda":  # the time window is the GPU's: a resume on another model would mix two
        if gpu_names is None:
            from cuda_agent.contracts import visible_gpu_names

            gpu_names = visible_gpu_names()
        settings["gpu"] = ", ".join(sorted(set(gpu_names)))
    if options.llm is not None:  # absent for the programmatic composer: its journals stay resumable
        settings["composer"] = {"name": "llm", "model": options.llm.model}
    return settings


def _check_backend(backend: str) -> None:
    """Before the journal is opened: a cuda run on a machine without a GPU would reject every candidate
    at its first step and record those rejections as decided, lost to a later run on a GPU."""
    from cuda_agent.contracts import BackendError, resolve_backend

    if backend not in ("cuda", "host"):
        raise SynthesisError(f"the backend must be cuda or host (auto resolved first), got {backend!r}")
    try:
        resolve_backend(backend)  # the commands' shared rule: cuda needs a GPU the driver shows
    except BackendError as exc:
        raise SynthesisError(str(exc)) from None


def _composer(options: RunOptions, operators: list[dict]):
    if options.llm is None:
        return ProgrammaticComposer(operators, options.config.scale)
    from ..compose.llm_composer import LLMComposer

    return LLMComposer(operators, options.config.scale, options.llm, concurrency=options.workers)

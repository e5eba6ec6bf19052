"""The synthesis run: draft, screen, check similarity, filter by execution in worker processes, keep.

The parent drafts each candidate from its own seed (compose/drafts.py: the programmatic composer
renders its plan at once; the LLM composer's drafts are written by a model on background
threads), screens its source statically (filter/screen.py: the source is parsed, never run
here), drops it when it is too similar to an evaluation program (decontamination) or to a task
already kept (near-duplicate), and hands the rest to a pool of worker processes
(filter/worker.py). Candidates are drawn for the category furthest below its quota (quotas.py),
so the kept set follows the target composition whichever composer writes them. Every decision
goes to the journal before the next one; a resumed run replays the journal.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import dataclasses
import hashlib
import multiprocessing
import signal
import threading
import time
from pathlib import Path

from ..catalogue import store
from ..compose.chat_client import ChatSettings, EndpointError
from ..compose.drafts import DraftRejected, ProgrammaticComposer, start_draft
from ..config import SynthesisConfig
from ..filter.execution import Rejected
from ..filter.screen import screen
from ..similarity.score import SimilarityIndex, fingerprint
from .journal import Journal, journal_path
from .quotas import quotas


class Stopped(RuntimeError):
    """The run was stopped (SIGTERM or Ctrl-C); what was decided is in the journal."""


@contextlib.contextmanager
def stop_on_sigterm():
    """SIGTERM raises Stopped in the main thread for the duration (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_workers(pool) -> None:
    """End the pool now: SIGTERM to each worker (each closes its evaluator children as it exits),
    then SIGKILL to any still alive after a grace period."""
    workers = multiprocessing.active_children()
    for worker in workers:
        worker.terminate()
    deadline = time.monotonic() + 20.0
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
    pool.shutdown(wait=False, cancel_futures=True)


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
        self.o, self.say = options, progress
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
        self.began = time.monotonic()
        self._replay()

    def _settings(self) -> dict:
        catalogue = Path(self.o.catalogue or store.DEFAULT_PATH).read_bytes()
        evals = sorted(self.eval_index.names)
        settings = {"config": self.o.config.to_dict(), "seed": self.o.seed, "backend": self.o.backend,
                    "catalogue_sha256": hashlib.sha256(catalogue).hexdigest()[:16],
                    "eval_programs_sha256": hashlib.sha256("\n".join(evals).encode()).hexdigest()[:16]}
        if self.o.llm is not None:  # absent for the programmatic composer: its journals stay resumable
            settings["composer"] = {"name": "llm", "model": self.o.llm.model}
        return settings

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
        plan, source = draft.plan, draft.source
        entry = {**entry, "ops": plan.ops, "input_shape": plan.input_shape, "output_shape": plan.output_shape,
                 "source": source}
        try:
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
        near, name = self.kept_index.nearest(fp, at_least=threshold)
        if near >= threshold:
            reason = f"similarity {near:.2f} to {name}"
            return {**entry, "status": "rejected", "stage": "duplicate", "reason": reason}, None
        job = {"key": entry["key"], "name": entry["name"], "source": entry["source"],
               "expected_shape": plan.output_shape, "shapes": plan.shapes(),
               "window_ms": self.o.config.window(self.o.backend), "memory_bytes": self.o.config.memory_bytes,
               "evaluator": self._evaluator_settings()}
        if entry.get("composer"):  # written by a model: it must also take the input it was asked to take
            job["input_shapes"] = [plan.input_shape]
        return entry, job

    def _evaluator_settings(self) -> dict | None:
        if not self.o.config.evaluator:
            return None
        from ..filter.evaluator_stage import evaluator_settings

        return evaluator_settings(self.o.backend, self.o.config.compile, self.o.cache_dir)

    # --- deciding -------------------------------------------------------------------------------

    def _decide(self, entry: dict, result: dict | None) -> None:
        if result is not None:
            entry = {**entry, **{k: v for k, v in result.items() if k != "key"}}
            if entry["status"] == "kept":  # a sibling kept while this one ran may be its near-duplicate
                near, name = self.kept_index.nearest(fingerprint(entry["source"]), self.o.config.similarity_threshold)
                if near >= self.o.config.similarity_threshold:
                    entry.update(status="rejected", stage="duplicate", reason=f"similarity {near:.2f} to {name}")
        if entry["status"] != "kept" and not entry.get("composer"):
            entry.pop("source", None)  # the seed gives it again; the journal stays small (a model's reply is kept)
        self.journal.add(entry)
        self._count(entry)
        self._report_progress(entry)

    def _report_progress(self, entry: dict) -> None:
        kept, decided = sum(self.kept.values()), len(self.journal.entries)
        hours = max(1e-9, (time.monotonic() - self.began) / 3600)
        what = "kept" if entry["status"] == "kept" else f"rejected at {entry['stage']}: {entry['reason'][:80]}"
        self.say(f"[{kept}/{self.o.count} kept, {decided} tried, {kept / hours:.0f} kept/h] {entry['name']} {what}")

    def run(self) -> dict:
        """Synthesise until every quota is met or its attempts are spent; returns the kept count per category.
        SIGTERM or Ctrl-C stops the workers (and the evaluator's children under them) and raises Stopped;
        an LLM endpoint that cannot answer stops them too and raises EndpointError. The journal keeps every
        decision, so running again resumes."""
        context = multiprocessing.get_context("spawn")
        from ..filter.worker import filter_candidate, start_worker

        drafting: dict = {}  # future of a draft -> entry
        filtering: dict = {}  # future of a worker's verdict -> entry
        pool = futures.ProcessPoolExecutor(self.o.workers, mp_context=context, initializer=start_worker)
        try:
            with stop_on_sigterm():
                self._loop(pool, drafting, filtering, filter_candidate)
        except (Stopped, KeyboardInterrupt):
            _stop_workers(pool)
            raise Stopped(f"stopped with {len(self.journal.entries)} candidates decided; "
                          f"{len(drafting) + len(filtering)} in flight are lost, run the same command to resume") \
                from None
        except EndpointError:
            _stop_workers(pool)
            raise
        pool.shutdown(wait=True)
        return dict(self.kept)

    def _open_categories(self, drafting: dict, filtering: dict) -> list[str]:
        counts: dict = {}
        for entry in [*drafting.values(), *filtering.values()]:
            counts[entry["category"]] = counts.get(entry["category"], 0) + 1
        return self._deficits(counts)

    def _room(self, drafting: dict, filtering: dict) -> bool:
        """A new draft may start: the workers' share plus the composer's drafts in flight leave room."""
        concurrency = self.composer.concurrency
        return len(drafting) + len(filtering) < self.o.workers + concurrency and len(drafting) < max(1, concurrency)

    def _loop(self, pool, drafting: dict, filtering: dict, filter_candidate) -> None:
        """Draft candidates while quotas are open and there is room; screen each draft as it is made, hand
        it to a worker, decide each as its worker finishes."""
        while True:
            open_ = self._open_categories(drafting, filtering)
            if open_ and self._room(drafting, filtering):
                entry, future = self._start(open_[0])
                if future.done():  # a programmatic draft: screened at once, in a reproducible order
                    self._screened(pool, filtering, filter_candidate, entry, future)
                else:
                    drafting[future] = entry
                continue
            if not drafting and not filtering:
                break
            finished, _ = futures.wait([*drafting, *filtering], return_when=futures.FIRST_COMPLETED)
            for future in [f for f in [*drafting, *filtering] if f in finished]:  # in the order they started
                if future in drafting:
                    self._screened(pool, filtering, filter_candidate, drafting.pop(future), future)
                else:
                    entry = filtering.pop(future)
                    self._decide(entry, self._result(future, entry))

    def _screened(self, pool, filtering: dict, filter_candidate, entry: dict, future) -> None:
        entry, job = self._drafted(entry, future)
        if job is None:
            self._decide(entry, None)
        else:
            filtering[pool.submit(filter_candidate, job)] = entry

    @staticmethod
    def _result(future, entry: dict) -> dict:
        try:
            return future.result()
        except Exception as exc:  # the worker process died under this candidate
            return {"status": "rejected", "stage": "worker", "reason": f"worker process failed: {exc}"[:200]}


def _composer(options: RunOptions, operators: list[dict]):
    if options.llm is None:
        return ProgrammaticComposer(operators, options.config.scale)
    from ..compose.llm_composer import LLMComposer

    return LLMComposer(operators, options.config.scale, options.llm, concurrency=options.workers)

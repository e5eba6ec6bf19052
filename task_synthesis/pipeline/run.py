"""The synthesis run: compose, screen by similarity, filter by execution in worker processes, keep.

The parent composes each candidate from its own seed, drops it when it is too similar to an
evaluation program (decontamination) or to a task already kept (near-duplicate), and hands the
rest to a pool of worker processes (filter/worker.py). Candidates are drawn for the category
furthest below its quota (quotas.py), so the kept set follows the target composition. Every
decision goes to the journal before the next one; a resumed run replays the journal.
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
from ..compose.composer import compose
from ..compose.render import render
from ..config import SynthesisConfig
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
        return {"config": self.o.config.to_dict(), "seed": self.o.seed, "backend": self.o.backend,
                "catalogue_sha256": hashlib.sha256(catalogue).hexdigest()[:16],
                "eval_programs_sha256": hashlib.sha256("\n".join(evals).encode()).hexdigest()[:16]}

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

    def _candidate(self, category: str) -> tuple[dict, dict | None]:
        """(journal entry so far, worker job or None when screened out already)."""
        key, index = self._next_key(category)
        seed = candidate_seed(self.o.seed, category, index)
        entry = {"key": key, "category": category, "index": index, "seed": seed, "name": task_name(category, index)}
        try:
            plan = compose(category, self.operators, seed, self.o.config.scale)
        except Exception as exc:
            return {**entry, "status": "rejected", "stage": "compose", "reason": str(exc)[:200]}, None
        source = render(plan)
        entry.update(ops=plan.ops, input_shape=plan.input_shape, output_shape=plan.output_shape, source=source)
        fp = fingerprint(source)
        threshold = self.o.config.similarity_threshold
        entry["eval_similarity"], entry["eval_nearest"] = self.eval_index.nearest(fp)
        if entry["eval_similarity"] >= threshold:
            return {**entry, "status": "rejected", "stage": "decontaminate",
                    "reason": f"similarity {entry['eval_similarity']:.2f} to {entry['eval_nearest']}"}, None
        near, name = self.kept_index.nearest(fp, at_least=threshold)
        if near >= threshold:
            reason = f"similarity {near:.2f} to {name}"
            return {**entry, "status": "rejected", "stage": "duplicate", "reason": reason}, None
        job = {"key": key, "name": entry["name"], "source": source, "expected_shape": plan.output_shape,
               "shapes": plan.shapes(), "window_ms": self.o.config.window(self.o.backend),
               "memory_bytes": self.o.config.memory_bytes, "evaluator": self._evaluator_settings()}
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
        if entry["status"] != "kept":
            entry.pop("source", None)  # the seed gives it again; the journal stays small
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
        SIGTERM or Ctrl-C stops the workers (and the evaluator's children under them) and raises Stopped:
        the journal keeps every decision, so running again resumes."""
        context = multiprocessing.get_context("spawn")
        from ..filter.worker import filter_candidate, start_worker

        in_flight: dict = {}  # future -> entry
        pool = futures.ProcessPoolExecutor(self.o.workers, mp_context=context, initializer=start_worker)
        try:
            with stop_on_sigterm():
                self._loop(pool, in_flight, filter_candidate)
        except (Stopped, KeyboardInterrupt):
            _stop_workers(pool)
            raise Stopped(f"stopped with {len(self.journal.entries)} candidates decided; "
                          f"{len(in_flight)} in flight are lost, run the same command to resume") from None
        pool.shutdown(wait=True)
        return dict(self.kept)

    def _loop(self, pool, in_flight: dict, filter_candidate) -> None:
        """Submit candidates while quotas are open and workers free; decide each as it finishes."""
        while True:
            counts = {}
            for entry in in_flight.values():
                counts[entry["category"]] = counts.get(entry["category"], 0) + 1
            open_ = self._deficits(counts)
            if open_ and len(in_flight) < self.o.workers:
                entry, job = self._candidate(open_[0])
                if job is None:
                    self._decide(entry, None)
                else:
                    in_flight[pool.submit(filter_candidate, job)] = entry
                continue
            if not in_flight:
                break
            finished, _ = futures.wait(in_flight, return_when=futures.FIRST_COMPLETED)
            for future in finished:
                entry = in_flight.pop(future)
                self._decide(entry, self._result(future, entry))

    @staticmethod
    def _result(future, entry: dict) -> dict:
        try:
            return future.result()
        except Exception as exc:  # the worker process died under this candidate
            return {"status": "rejected", "stage": "worker", "reason": f"worker process failed: {exc}"[:200]}

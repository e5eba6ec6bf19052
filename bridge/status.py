"""Render the broker's status snapshot (``cuda-agent bridge-status``) as a compact text view."""

from __future__ import annotations


def format_status(status: dict) -> str:
    """Queue depth per service, in-flight jobs, throughput, counters, then one line per worker."""
    queued = status.get("queued") or {}
    counters = status.get("counters") or {}
    journal = status.get("journal") or {}
    lines = [
        f"broker {status['epoch'][:8]} on {', '.join(status.get('endpoints', []))}, up {status['uptime_s']:.0f} s",
        "queued: " + (", ".join(f"{s}={n}" for s, n in sorted(queued.items())) or "none")
        + f" | in flight: {status['inflight']} | unfinished: {status['unfinished']}"
        + f" | owed results: {status['owed_results']}",
        f"throughput: {status['throughput_10s']:.1f} jobs/s (10 s), {status['throughput_60s']:.1f} jobs/s (60 s)",
        f"services: {', '.join(status.get('services') or []) or 'none'} | CURVE: {'on' if status.get('curve') else 'off'}"
        f" | clients with jobs: {status.get('clients_with_jobs', 0)}, {status.get('unfinished_bytes', 0)} bytes",
        "counters: " + ", ".join(f"{k}={v}" for k, v in counters.items()),
        f"journal: {journal.get('unfinished', 0)} unfinished, {journal.get('finished', 0)} finished, "
        f"{journal.get('owed_deliveries', 0)} deliveries owed",
        f"workers: {len(status['workers'])}",
    ]
    for w in sorted(status["workers"], key=lambda w: w["id"]):
        caps = w.get("capabilities") or {}
        device = caps.get("gpu") or caps.get("device") or "-"
        torch = caps.get("torch", "-")
        state = "draining" if w["draining"] else "ready"
        lines.append(
            f"  {w['id']:<32} {','.join(w['services']):<18} {w['inflight']}/{w['capacity']} {state:<8} "
            f"silent {w['silent_s']:.1f}s  gpu={device} torch={torch} cvd={caps.get('cuda_visible_devices')!r}"
        )
    return "\n".join(lines)

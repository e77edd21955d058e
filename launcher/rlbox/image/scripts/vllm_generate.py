"""Run inside an image by `rlbox rehearse` (a release with vLLM's CPU build): start vLLM's engine on the tiny
model at argv[1] and generate a few tokens, as a rollout or `rlbox serve` would. Prints one JSON line:
{"ok": bool, "version": vLLM's, "platform": its device type, "tokens": N, "error": why not, in one line}.
The engine core is spawned, hence the __main__ guard. Standard library and vLLM only.

The engine's KV cache is given a size (``kv_cache_memory_bytes``, 256 MiB: a 256-token context of a tiny model)
rather than a fraction of the host's memory: on the CPU, vLLM takes the fraction of the NUMA node's memory
and subtracts what its worker already holds, so a small fraction fails on a host with less memory per node
("less than requested memory for kv (-0.0/0.94 GiB)", 18.7 GiB on node 0 here) while the engine is sound.

When the engine does not start, vLLM raises "Engine core initialization failed. See root cause above." and
the cause is only in what its engine core and workers (processes of their own) wrote to stderr. So stderr
(the descriptor the children inherit) goes to a file while the engine starts, is passed on unchanged, and the
last exception line found there is the error reported."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import traceback

KV_CACHE_BYTES = 256 << 20
# "(EngineCore pid=36) ERROR 11-28 21:01:21 [FILE:LINE] RuntimeError: Worker failed with error '...'"
PREFIX = re.compile(r"^(\([\w.-]+ pid=\d+\) )?((ERROR|WARNING|INFO) [\d-]+ [\d:]+ \[[^\]]*\] )?")
EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt)|SystemExit)(: .*)?$")


def root_cause(text: str) -> str | None:
    """The last exception line the engine's processes wrote (their log prefixes removed), or None."""
    found = None
    for line in text.splitlines():
        line = PREFIX.sub("", line.strip())
        if EXCEPTION.match(line):
            found = line
    return found


def said(err: BaseException) -> str:
    """An exception's own last line (``Type: message``)."""
    lines = [line for line in traceback.format_exception_only(type(err), err) if line.strip()]
    return lines[-1].strip() if lines else repr(err)


def start_engine(LLM, model: str):
    """LLM(...) with stderr, the children's too, copied to a file; on failure, the cause they wrote."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            return LLM(model=model, kv_cache_memory_bytes=KV_CACHE_BYTES, enforce_eager=True, max_model_len=256), None
        except Exception as err:  # noqa: BLE001 - the engine's failure is the answer
            failed = err
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            written = log.read().decode("utf-8", "replace")
            sys.stderr.write(written)
            sys.stderr.flush()
    own = said(failed)
    cause = root_cause(written)
    return None, (f"{cause} (the engine said: {own})" if cause and cause != own else own)


def main() -> int:
    out = {"ok": False}
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.platforms import current_platform

        out["version"] = vllm.__version__
        out["platform"] = current_platform.device_type
        llm, why = start_engine(LLM, sys.argv[1])
        if llm is None:
            out["error"] = why[:600]
        else:
            done = llm.generate(["2 + 3 ="], SamplingParams(max_tokens=4, temperature=0))[0]
            out["tokens"] = len(done.outputs[0].token_ids)
            out["ok"] = out["tokens"] > 0
    except BaseException as err:  # noqa: BLE001 - whatever stops the engine is the answer
        out["error"] = said(err)[:300]
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Run inside an image by `rlbox rehearse` (a release with vLLM's CPU build): start vLLM's engine on the tiny
model at argv[1] and generate a few tokens, as a rollout or `rlbox serve` would. Prints one JSON line:
{"ok": bool, "version": vLLM's, "platform": its device type, "tokens": N, "error": the last line}.
The engine core is spawned, hence the __main__ guard. Standard library and vLLM only."""

import json
import sys
import traceback


def main() -> int:
    out = {"ok": False}
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.platforms import current_platform

        out["version"] = vllm.__version__
        out["platform"] = current_platform.device_type
        llm = LLM(model=sys.argv[1], gpu_memory_utilization=0.05, enforce_eager=True, max_model_len=256)
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

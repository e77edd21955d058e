#!/usr/bin/env python3
"""Make a tiny random Qwen2-style model with a tokenizer trained here, for CPU training tests.

    python3 make-tiny-model.py OUT_DIR [--corpus FILE.jsonl ...]

Runs inside an image with transformers and tokenizers (e.g. localhost/rlbox/verl-cpu:amd64):
no hub, no download. A byte-level BPE tokenizer (vocab 512) is trained on the given JSONL rows'
text (the GSM8K-format sample) plus digits and the chat template's markers; the model is
Qwen2ForCausalLM with 2 layers, hidden 64, 2 heads (1 KV head; head size 32, the smallest vLLM's CPU attention takes), random weights from a fixed
seed, saved with save_pretrained (safetensors, float32): about 0.6 MB. Deterministic: the same
inputs give the same files.
"""

import argparse
import json
import os
import sys

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's chat template, trimmed to what verl's RL dataset uses (system/user/assistant turns).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(files):
    texts = ["0123456789 #### + - * / = . , ? Let's think step by step and output the final answer after"]
    for path in files:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                texts += [str(v) for v in row.values()]
    return texts


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--corpus", nargs="*", default=[])
    ap.add_argument("--vocab", type=int, default=512)
    args = ap.parse_args(argv)

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(args.corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, model_max_length=2048,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(args.out)

    torch.manual_seed(19)
    config = Qwen2Config(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         tie_word_embeddings=True, torch_dtype="float32",
                         bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    model.save_pretrained(args.out, safe_serialization=True)
    for name in os.listdir(args.out):  # readable by any user a node container runs as
        os.chmod(os.path.join(args.out, name), 0o644)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: Qwen2ForCausalLM, {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"vocab {len(fast)}, {params} parameters -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Peer for `gpulab bench llm`: Hugging Face transformers `generate` on the same model shape,
random bf16 weights, greedy, the same batch sizes and prompt/output lengths, on one GPU.
Prints a JSON array in gpulab's result schema (suite "llm_peer_transformers").

    python3 bench/peers/hf_llama.py [--config llama2-7b] [--batch 1,16] [--input 128] [--output 128] [--prefill 2048]

TTFT is `generate` with one new token; the decode step is (full generate - TTFT) / (output - 1);
prefill is one forward pass over a `--prefill`-token prompt, keeping only the last logits.
"""
import argparse
import datetime
import json
import statistics
import subprocess
import time

import torch
import transformers

SHAPES = {
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                      rope_theta=10000.0),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                      rope_theta=500000.0),
}


def timed(fn, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama2-7b", choices=sorted(SHAPES))
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPES[args.config], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
    gpu = torch.cuda.get_device_name(0)
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = []

    def add(name, metric, value, unit, params):
        results.append({"schema": 1, "suite": "llm_peer_transformers", "name": name, "metric": metric,
                        "value": value, "unit": unit,
                        "params": dict(params, model=args.config + " (random weights)", peer="transformers",
                                       transformers=transformers.__version__, torch=torch.__version__),
                        "gpu": {"name": gpu}, "git": rev, "time": now})

    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch.split(",")]:
            ids = torch.randint(3, config.vocab_size, (batch, args.input), generator=g, device="cuda")
            mask = torch.ones_like(ids)

            def gen(n):
                return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=0)

            gen(4)  # warm-up
            ttft = timed(lambda: gen(1), args.reps)
            full = timed(lambda: gen(args.output), args.reps)
            step = (full - ttft) / max(args.output - 1, 1)
            params = {"batch": batch, "input": args.input, "output": args.output, "ttft_ms": ttft,
                      "generate_ms": full, "step_ms": step,
                      "end_to_end_tokens_per_s": 1e3 * batch * args.output / full}
            add(f"decode_b{batch}", "tokens_per_second", 1e3 * batch / step, "tokens/s", params)
            add(f"decode_b{batch}_ttft", "latency", ttft, "ms", params)
            print(f"transformers batch {batch}: TTFT {ttft:.1f} ms, step {step:.3f} ms, "
                  f"{1e3 * batch / step:.1f} decode tokens/s", flush=True)
        if args.prefill > 0:
            ids = torch.randint(3, config.vocab_size, (1, args.prefill), generator=g, device="cuda")
            run = lambda: model(input_ids=ids, logits_to_keep=1)
            run()
            ms = timed(run, args.reps)
            add(f"prefill_{args.prefill}", "latency", ms, "ms", {"tokens": args.prefill})
            print(f"transformers prefill {args.prefill}: {ms:.2f} ms", flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

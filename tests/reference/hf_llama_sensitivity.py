#!/usr/bin/env python3
"""How chaotic a random LLaMA-2-7B-shape model is, by init std (transformers' initializer_range): why
tests/reference/hf_llama_random.py writes its checkpoint at std 0.01. For each std, on the GPU:
- amplification: relative change of the float32 logits per relative change (1e-6) of the input
  embeddings, a measure of how much any rounding difference grows through the 32 layers;
- bf16_relL2 / bf16_top1: transformers' own bf16 forward against its float32 forward.
A trained model is not chaotic; at transformers' default 0.02 a random one amplifies 16.8x and its
own bf16 forward lands 5.9 % from float32 (session 7, H200), so no bf16 engine can meet a 2e-2 bar
there. Prints one line per std and last "pick STD", the largest with amplification <= 5 and bf16
within 2e-2.

    python3 tests/reference/hf_llama_sensitivity.py
"""
import torch
import transformers

from hf_llama_random import SHAPE  # this directory: run as python3 tests/reference/...


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(3, SHAPE["vocab_size"], (1, 64), generator=g, device="cuda")
    pick = None
    for std in [0.02, 0.015, 0.01, 0.0075, 0.005]:
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**SHAPE, initializer_range=std)
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
        with torch.inference_mode():
            bf16 = model(input_ids=ids).logits[0].float()
            model = model.float()
            embeds = model.model.embed_tokens(ids)
            fp32 = model(inputs_embeds=embeds).logits[0]
            noise = torch.randn(embeds.shape, generator=g, device="cuda")
            moved = model(inputs_embeds=embeds * (1 + 1e-6 * noise)).logits[0]
            amplification = ((moved - fp32).norm() / fp32.norm()).item() / 1e-6
            bf16_rel = ((bf16 - fp32).norm() / fp32.norm()).item()
            top1 = (bf16.argmax(-1) == fp32.argmax(-1)).float().mean().item()
        print(f"std {std} amplification {amplification:.3g} bf16_relL2 {bf16_rel:.3g} bf16_top1 {top1:.3f} "
              f"logit_std {fp32.std().item():.3g}", flush=True)
        if pick is None and amplification <= 5 and bf16_rel <= 0.02:
            pick = std
        del model
        torch.cuda.empty_cache()
    print("pick", pick)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Differential check of `gpulab tokenize` against Hugging Face `tokenizers` on random text.

Needs the `tokenizers` package (pip install tokenizers==0.23.2); not part of CTest.
  python3 tests/llm/compare_tokenizer_with_hf.py BUILD/src/cli/gpulab [N] [tokenizer.json or folder ...]
Without tokenizer paths it checks the fixtures in tests/data. Exits 1 on any difference.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
WORDS = ["'s", "'LL", "don't", "\r\n", "\n\n", "   ", "\t", "<|eot_id|>", "<s>", "</s>", "\u2581", "123456", "3.14",
         "caf\u00e9", "e\u0301", "\U0001F680", "\u4e2d\u6587", "x-y--z", "\u00a0", "\u3000"]
RANGES = [(0x20, 0x7E)] * 4 + [(0x09, 0x0D), (0x80, 0x24F), (0x300, 0x36F), (0x400, 0x4FF), (0x2000, 0x200B),
                                (0x4E00, 0x4E40), (0xAC00, 0xAC40), (0x1F300, 0x1F330)]


def random_text(rng):
    parts = []
    for _ in range(rng.randint(0, 12)):
        if rng.random() < 0.35:
            parts.append(rng.choice(WORDS))
        else:
            lo, hi = rng.choice(RANGES)
            parts.append(''.join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
    return ''.join(parts)


def gpulab(exe, *args):
    r = subprocess.run([exe, 'tokenize', *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f'gpulab tokenize {" ".join(args)}: {r.stderr.strip()}')
    return json.loads(r.stdout)


def main():
    exe = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    paths = sys.argv[3:] or [os.path.join(HERE, '..', 'data', d) for d in ('tokenizer_bytelevel', 'tokenizer_spm')]
    rng = random.Random(0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        text_file = os.path.join(tmp, 'text.txt')
        for path in paths:
            file = os.path.join(path, 'tokenizer.json') if os.path.isdir(path) else path
            hf = Tokenizer.from_file(file)
            bad = 0
            for _ in range(n):
                text = random_text(rng)
                with open(text_file, 'w', encoding='utf-8', newline='') as f:
                    f.write(text)
                for special in (False, True):
                    expected = hf.encode(text, add_special_tokens=special).ids
                    got = gpulab(exe, '--model', file, '--file', text_file, *(['--add-special'] if special else []))['ids']
                    decoded = gpulab(exe, '--model', file, '--ids', ','.join(map(str, expected)))['text'] if expected else ''
                    if got != expected or decoded != hf.decode(expected, skip_special_tokens=False):
                        bad += 1
                        if bad <= 3:
                            print(f'  {text!r} add_special={special}\n    hf     {expected}\n    gpulab {got}')
            print(f'{file}: {bad} of {2 * n} differ')
            failures += bad
    sys.exit(1 if failures else 0)


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""Load test for a running `gpulab serve` (Python standard library only).

N clients (default 256) loop for D seconds over /v1/completions and /v1/chat/completions with
mixed prompt lengths, streaming and not; a share of streaming clients hang up mid-stream. Reports
p50/p99 time to first token (TTFT), inter-token latency (ITL), time per output token (TPOT),
throughput and failures, then checks on /metrics that the KV cache is empty again and that the
server's RSS stayed flat.

A stream shows tokens as text pieces, and a token without text of its own (part of a UTF-8
character, an id the tokenizer lacks) adds no piece. So TTFT is the time to the first piece and
ITL the gap between pieces. Tokens are counted from the usage the last chunk carries, and TPOT is
a stream's (end - first piece) / (tokens - 1), as vLLM's benchmark defines it. With dummy weights,
give the model the tokenizer's vocabulary (tests/data/llama3_8b_shape_test_vocab.json): over
llama3-8b's 128k ids, the 1,024-token test tokenizer has text for fewer than 1 % of them.

The load runs in rounds on the same server (--rounds, default 2; the duration is split between
them) and the server's memory is sampled throughout. The first round, at full concurrency, is the
warm-up: buffers sized to the largest batch, malloc arenas of the connection threads, library
caches grow once. The "RSS flat" check judges the growth from the end of the first round to the
end of the last (a leak grows every round, warm-up does not); both growths are reported. The
server's heap bytes in use (live malloc allocations, /metrics process_heap_in_use_bytes) are
judged the same way: a leak grows them, arenas that keep freed memory grow only the RSS.

With --sigterm-pid PID it finally starts a few long streams, sends SIGTERM to PID once they are
under way, and checks that each still ends with [DONE] (in-flight requests finish on shutdown).

Exit status 0 when every check holds. --json FILE writes the figures.
"""
import argparse
import http.client
import json
import os
import random
import signal
import sys
import threading
import time

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "jolly zebras near the old mill by the river and every story begins once upon a time").split()


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(q / 100.0 * (len(values) - 1)))))
    return values[k]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ttft = []
        self.itl = []
        self.tpot = []
        self.latency = []
        self.ok = 0
        self.disconnected = 0
        self.busy = 0  # HTTP 429: refused by the queue limit (allowed, counted apart)
        self.failures = []
        self.tokens = 0

    def fail(self, what):
        with self.lock:
            self.failures.append(what)


def headers(args):
    h = {"Content-Type": "application/json"}
    if args.api_key:
        h["Authorization"] = "Bearer " + args.api_key
    return h


def metrics(args):
    conn = http.client.HTTPConnection(args.host, args.port, timeout=30)
    conn.request("GET", "/metrics", headers=headers(args))
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            out[name] = float(value)
    return out


def make_body(rng, chat, stream):
    n = rng.choice((4, 16, 48, 120))  # mixed prompt lengths, in words (the tiny fixture's context is 512 tokens)
    text = " ".join(rng.choice(WORDS) for _ in range(n))
    body = {"max_tokens": rng.choice((8, 16, 32, 64)), "temperature": rng.choice((0, 0.8)), "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def one_request(args, rng, stats):
    chat = rng.random() < 0.5
    stream = rng.random() < 0.6
    hang_up_after = rng.randint(1, 4) if stream and rng.random() < args.disconnect_share else None
    body = make_body(rng, chat, stream)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    start = time.monotonic()
    conn = http.client.HTTPConnection(args.host, args.port, timeout=args.request_timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers(args))
        r = conn.getresponse()
        if r.status == 429:
            r.read()
            with stats.lock:
                stats.busy += 1
            time.sleep(0.05)
            return
        if r.status != 200:
            stats.fail(f"HTTP {r.status}: {r.read()[:200]!r}")
            return
        if not stream:
            reply = json.loads(r.read())
            done = time.monotonic()
            with stats.lock:
                stats.ok += 1
                stats.latency.append(done - start)
                stats.tokens += reply["usage"]["completion_tokens"]
            return
        first = last = None
        pieces = 0
        tokens = None  # from the usage of the last chunk
        finished = False
        gaps = []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                finished = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            choice = chunk["choices"][0]
            text = choice.get("text") if not chat else choice.get("delta", {}).get("content")
            if text:
                now = time.monotonic()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
                pieces += 1
                if hang_up_after is not None and pieces >= hang_up_after:
                    r.close()  # the client leaves mid-stream (the connection closes below)
                    with stats.lock:
                        stats.disconnected += 1
                    return
        if not finished:
            stats.fail("stream ended without [DONE]")
            return
        if tokens is None:
            stats.fail("stream ended without usage in its last chunk")
            return
        end = time.monotonic()
        with stats.lock:
            stats.ok += 1
            stats.latency.append(end - start)
            stats.tokens += tokens
            if first is not None:
                stats.ttft.append(first - start)
                if tokens > 1:
                    stats.tpot.append((end - first) / (tokens - 1))
            stats.itl.extend(gaps)
    except Exception as e:  # noqa: BLE001 - every error is a failed request
        stats.fail(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def client(args, seed, deadline, stats):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        one_request(args, rng, stats)


def wait_idle(args, timeout=120):
    end = time.monotonic() + timeout
    m = metrics(args)
    while time.monotonic() < end:
        m = metrics(args)
        if m.get("gpulab_requests_running", 0) == 0 and m.get("gpulab_requests_waiting", 0) == 0:
            break
        time.sleep(0.2)
    return m


def sigterm_check(args):
    """Long streams in flight when SIGTERM arrives must still end with [DONE]."""
    results = [None] * args.sigterm_streams
    started = threading.Barrier(args.sigterm_streams + 1)

    def stream(i):
        conn = http.client.HTTPConnection(args.host, args.port, timeout=args.request_timeout)
        got_first = False
        try:
            body = {"prompt": "Once upon a time", "max_tokens": args.sigterm_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            conn.request("POST", "/v1/completions", body=json.dumps(body), headers=headers(args))
            r = conn.getresponse()
            while True:
                line = r.readline()
                if not line:
                    results[i] = "closed without [DONE]"
                    break
                if line.startswith(b"data: ") and not got_first:
                    got_first = True
                    started.wait()
                if line.strip() == b"data: [DONE]":
                    results[i] = "done"
                    break
        except Exception as e:  # noqa: BLE001
            results[i] = f"{type(e).__name__}: {e}"
        finally:
            if not got_first:
                started.abort()
            conn.close()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.sigterm_streams)]
    for t in threads:
        t.start()
    try:
        started.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    os.kill(args.sigterm_pid, signal.SIGTERM)
    for t in threads:
        t.join()
    return results


RSS = "process_resident_memory_bytes"
HEAP = "process_heap_in_use_bytes"  # live malloc allocations: a leak grows it, arenas keeping freed memory do not
HEAP_FREE = "process_heap_free_bytes"
MB = 2**20


class MemorySampler(threading.Thread):
    """Samples the server's RSS and heap from /metrics every `interval` seconds."""

    def __init__(self, args, interval):
        super().__init__(daemon=True)
        self.args, self.interval = args, interval
        self.samples = []  # (seconds, rss MB, heap in use MB, heap free MB)
        self.stopped = threading.Event()
        self.start_time = time.monotonic()

    def run(self):
        while not self.stopped.wait(self.interval):
            try:
                m = metrics(self.args)
            except OSError:
                continue  # a busy server may time a sample out; the next one counts
            self.samples.append((round(time.monotonic() - self.start_time, 1),
                                 *(round(m.get(k, 0) / MB, 1) for k in (RSS, HEAP, HEAP_FREE))))

    def now(self):
        return time.monotonic() - self.start_time

    def peak_rss_since(self, t):
        return max((rss for s, rss, _, _ in self.samples if s >= t), default=0)


def run_round(args, index, seconds, stats):
    deadline = time.monotonic() + seconds
    seeds = [args.seed * 100003 + index * args.clients + i for i in range(args.clients)]  # fresh prompts each round
    threads = [threading.Thread(target=client, args=(args, seed, deadline, stats), daemon=True) for seed in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load, split between the rounds")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of load on the same server; the first is the warm-up (1: judge RSS from start to end)")
    p.add_argument("--disconnect-share", type=float, default=0.1, help="share of streams the client leaves early")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--rss-growth-mb", type=float, default=64.0,
                   help="allowed RSS growth after the warm-up round (end of round 1 to end of the last)")
    p.add_argument("--rss-interval", type=float, default=1.0, help="seconds between RSS samples")
    p.add_argument("--api-key", default=os.environ.get("GPULAB_API_KEY", ""))
    p.add_argument("--sigterm-pid", type=int, default=0, help="after the load, SIGTERM this server mid-stream")
    p.add_argument("--sigterm-streams", type=int, default=4)
    p.add_argument("--sigterm-tokens", type=int, default=48)
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")

    stats = Stats()
    # A few requests one at a time first: the engine's first steps (kernels loaded, plans made)
    # come before the first RSS figure.
    warm = Stats()
    for i in range(8):
        one_request(args, random.Random(1000 + i), warm)
    start_m = metrics(args)

    sampler = MemorySampler(args, args.rss_interval)
    sampler.start()
    idle = []    # /metrics when idle after each round
    rounds = []  # per round: requests, RSS and heap when idle after it, peak RSS during it
    start = time.monotonic()
    for r in range(args.rounds):
        began = sampler.now()
        before = stats.ok + stats.disconnected
        run_round(args, r, args.duration / args.rounds, stats)
        idle.append(wait_idle(args))
        rounds.append({"requests": stats.ok + stats.disconnected - before,
                       "rss_mb": round(idle[-1].get(RSS, 0) / MB, 1),
                       "rss_peak_mb": max(sampler.peak_rss_since(began), round(idle[-1].get(RSS, 0) / MB, 1)),
                       "heap_in_use_mb": round(idle[-1].get(HEAP, 0) / MB, 1),
                       "heap_free_mb": round(idle[-1].get(HEAP_FREE, 0) / MB, 1)})
    elapsed = time.monotonic() - start
    sampler.stopped.set()
    sampler.join()

    m = idle[-1]
    kv_used = m.get("gpulab_kv_used_tokens", -1)
    # Warm-up: from the start to the end of round 1. Steady state: from the end of round 1 to the
    # end of the last (with one round there is no steady state to tell apart: all growth counts).
    steady_start = idle[0] if args.rounds > 1 else start_m
    steady_requests = sum(x["requests"] for x in rounds[1:]) if args.rounds > 1 else rounds[0]["requests"]
    grew = lambda key, a, b: (b.get(key, 0) - a.get(key, 0)) / MB  # noqa: E731
    rss_steady, heap_steady = grew(RSS, steady_start, m), grew(HEAP, steady_start, m)
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    report = {
        "clients": args.clients, "duration_s": round(elapsed, 1), "rounds": args.rounds,
        "requests_ok": stats.ok, "requests_disconnected": stats.disconnected, "requests_429": stats.busy,
        "failures": len(stats.failures), "failure_examples": stats.failures[:5],
        "requests_per_s": round((stats.ok + stats.disconnected) / elapsed, 2),
        "tokens_per_s": round(stats.tokens / elapsed, 1),
        "ttft_p50_ms": ms(percentile(stats.ttft, 50)), "ttft_p99_ms": ms(percentile(stats.ttft, 99)),
        "itl_p50_ms": ms(percentile(stats.itl, 50)), "itl_p99_ms": ms(percentile(stats.itl, 99)),
        "tpot_p50_ms": ms(percentile(stats.tpot, 50)), "tpot_p99_ms": ms(percentile(stats.tpot, 99)),
        "latency_p50_ms": ms(percentile(stats.latency, 50)), "latency_p99_ms": ms(percentile(stats.latency, 99)),
        "kv_used_tokens_after": kv_used,
        "requests_cancelled_server": m.get("gpulab_requests_cancelled_total"),
        "rss_start_mb": round(start_m.get(RSS, 0) / MB, 1), "rss_end_mb": round(m.get(RSS, 0) / MB, 1),
        "rss_warmup_growth_mb": round(grew(RSS, start_m, idle[0]), 1),
        "rss_steady_growth_mb": round(rss_steady, 1),
        "heap_in_use_start_mb": round(start_m.get(HEAP, 0) / MB, 1), "heap_in_use_end_mb": round(m.get(HEAP, 0) / MB, 1),
        "heap_warmup_growth_mb": round(grew(HEAP, start_m, idle[0]), 1),
        "heap_steady_growth_mb": round(heap_steady, 1),
        "heap_steady_bytes_per_request": round(heap_steady * MB / max(steady_requests, 1)),
        "rounds_memory": rounds,
    }
    # Where the server's time went over the rounds (from /metrics, servers that count it):
    # steps, tokens fed per step, and the share of the wall time inside the engine and in steps.
    delta = lambda key: m.get(key, 0) - start_m.get(key, 0)  # noqa: E731
    if "gpulab_engine_seconds_total" in m and delta("gpulab_steps_total") > 0:
        steps = delta("gpulab_steps_total")
        report["server_steps"] = int(steps)
        report["server_rows_per_step"] = round(delta("gpulab_step_rows_total") / steps, 1)
        report["server_engine_ms_per_step"] = round(1000 * delta("gpulab_engine_seconds_total") / steps, 2)
        report["server_step_ms_per_step"] = round(1000 * delta("gpulab_step_seconds_total") / steps, 2)
        report["server_engine_busy"] = round(delta("gpulab_engine_seconds_total") / elapsed, 3)
    checks = {
        "no failed requests": not stats.failures,
        "some requests completed": stats.ok > 0,
        "KV cache empty after the load": kv_used == 0,
        "RSS flat": start_m.get(RSS, 0) > 0 and rss_steady <= args.rss_growth_mb,
    }
    if HEAP in m:  # servers before the heap metrics lack it
        checks["heap in use flat (no leak)"] = heap_steady <= args.rss_growth_mb
    if args.sigterm_pid:
        results = sigterm_check(args)
        report["sigterm_streams"] = results
        checks["in-flight streams finish after SIGTERM"] = all(r == "done" for r in results)
    report["checks"] = checks

    for k, v in report.items():
        if k != "checks":
            print(f"{k:28s} {v}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        report["memory_samples"] = {"columns": ["s", "rss_mb", "heap_in_use_mb", "heap_free_mb"], "rows": sampler.samples}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

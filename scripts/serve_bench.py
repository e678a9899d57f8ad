#!/usr/bin/env python3
"""Throughput and latency of lowbit serve: C concurrent streaming clients, each sending greedy completions one
after another, for each C given. Reports generated tokens per second over the whole run, time to first token and
inter-token latency (gaps between streamed chunks that carry text) p50/p99. Standard library only.

  scripts/serve_bench.py MODEL [--tokenizer FILE] [--clients 1,4,16] [--requests-per-client 4] [--max-tokens 128]
                         [--prompt TEXT] [--parallel 16] [--ctx 512] [--threads N] [--lowbit build/release/lowbit]
                         [--device cpu|cuda]
"""
import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def one_request(port, prompt, max_tokens):
    """(ttft s, [gaps s], completion tokens) of one streamed greedy completion."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]}")
    ttft, last, gaps, tokens = None, None, [], 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("choices") and chunk["choices"][0]["text"]:
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            else:
                gaps.append(now - last)
            last = now
    conn.close()
    return ttft, gaps, tokens


def run(port, clients, per_client, prompt, max_tokens):
    results, lock = [], threading.Lock()

    def client():
        for _ in range(per_client):
            r = one_request(port, prompt, max_tokens)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results if r[0] is not None]
    gaps = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    return {"clients": clients, "requests": len(results), "tokens": tokens, "seconds": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": 1e3 * statistics.median(ttfts),
            "ttft_p99_ms": 1e3 * percentile(ttfts, 99), "itl_p50_ms": 1e3 * percentile(gaps, 50),
            "itl_p99_ms": 1e3 * percentile(gaps, 99)}


def main():
    global MODEL_ID
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="Once upon a time, in a small village by the sea,")
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--lowbit", default="build/release/lowbit")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (lowbit serve --device)")
    a = ap.parse_args()
    MODEL_ID = a.model.rstrip("/").rsplit("/", 1)[-1]
    cmd = [a.lowbit, "serve", a.model, "--port", "0", "--parallel", str(a.parallel), "--ctx", str(a.ctx),
           "--device", a.device]
    if a.tokenizer:
        cmd += ["--tokenizer", a.tokenizer]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        while port is None:
            line = server.stderr.readline()
            if not line:
                sys.exit("lowbit serve exited before listening")
            if "listening on http://" in line:
                port = int(line.rsplit(":", 1)[1])
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        one_request(port, a.prompt, 8)  # warm-up
        print("| clients | requests | tokens | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for c in (int(x) for x in a.clients.split(",")):
            r = run(port, c, a.requests_per_client, a.prompt, a.max_tokens)
            print(f"| {r['clients']} | {r['requests']} | {r['tokens']} | {r['tokens_per_s']:.1f} | "
                  f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} |",
                  flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)


MODEL_ID = ""
if __name__ == "__main__":
    main()

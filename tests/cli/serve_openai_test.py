#!/usr/bin/env python3
"""lowbit serve against real clients, on stories260K over loopback.

The `openai` Python package (PyPI, pinned) is pip-installed once into the cache directory, as the demo fetches its
model; without ../shared or without PyPI the test exits 77, which ctest reports as skipped. Checks: chat, streamed
chat, completions (equal to `lowbit generate`), logprobs, stop strings, the errors the openai client sees (bad key,
n = 2, unknown model, prompt too long, response_format json_object), a malformed-request suite on raw HTTP
(invalid JSON, wrong types, oversized body, garbage bytes, a client leaving mid-stream), a load test (32
concurrent streaming clients, 64 greedy requests, each equal to the same request alone) and SIGTERM.

usage: serve_openai_test.py LOWBIT_BINARY SHARED_DIR CACHE_DIR
LOWBIT_TEST_DEVICE=cuda runs the server (and the `lowbit generate` it is compared with) on the GPU: the device
machine's load test.
"""
import concurrent.futures
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

OPENAI = "openai==1.109.1"
SKIP = 77
KEY = "sk-lowbit-test"
DEVICE = ["--device", os.environ.get("LOWBIT_TEST_DEVICE", "cpu")]
# ChatML, refusing one message text the way real templates refuse conversations they cannot render.
CHATML = ("{% for m in messages %}{% if m['content'] == 'RAISE' %}{{ raise_exception('no RAISE here') }}{% endif %}"
          "{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


def import_openai(cache):
    target = pathlib.Path(cache) / ("python-" + OPENAI.replace("==", "-"))
    if not target.is_dir():
        # Installed beside the target and renamed into place, so that two runs at once (release and debug) never
        # see a half-installed package; the loser of the rename drops its copy.
        target.parent.mkdir(parents=True, exist_ok=True)
        part = tempfile.mkdtemp(prefix=target.name + ".part-", dir=target.parent)
        print(f"[serve test] pip install {OPENAI} into {target} (once)", file=sys.stderr)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--target", part, OPENAI], capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(part, ignore_errors=True)
            skip(f"pip could not install {OPENAI} (PyPI unreachable?): {r.stderr.strip().splitlines()[-1:]}")
        try:
            os.rename(part, target)
        except OSError:
            shutil.rmtree(part, ignore_errors=True)
    sys.path.insert(0, str(target))
    import openai  # noqa: E402
    return openai


class Server:
    """lowbit serve on 127.0.0.1, any free port (read from its log line)."""

    def __init__(self, lowbit, model_dir, template, *extra):
        self.proc = subprocess.Popen(
            [lowbit, "serve", str(model_dir / "stories260K.bin"), "--tokenizer", str(model_dir / "tok512.bin"),
             "--port", "0", "--chat-template", template, "--threads", "2", *extra],
            stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.time() + 60
        while self.port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("lowbit serve exited before listening")
            if "listening on http://127.0.0.1:" in line:
                self.port = int(line.rsplit(":", 1)[1])
        # Keep draining the log so the server never blocks on a full pipe.
        self.lines = []
        self.drain = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self.drain.start()

    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def raw(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


class ServeTest(unittest.TestCase):
    lowbit = shared = cache = None

    @classmethod
    def setUpClass(cls):
        cls.openai = import_openai(cls.cache)
        cls.model_dir = pathlib.Path(cls.shared) / "models" / "stories260K"
        cls.template = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)
        cls.template.write(CHATML)
        cls.template.close()
        cls.server = Server(cls.lowbit, cls.model_dir, cls.template.name, "--parallel", "4", "--ctx", "512",
                            "--api-key", KEY, "--max-connections", "48", "--max-body", "65536", *DEVICE)
        cls.client = cls.openai.OpenAI(base_url=cls.server.url(), api_key=KEY, max_retries=0, timeout=120)

    @classmethod
    def tearDownClass(cls):
        if cls.server.proc.poll() is None:
            cls.server.stop()
        os.unlink(cls.template.name)

    def chat(self, content, **kw):
        return self.client.chat.completions.create(model="stories260K.bin", messages=[
            {"role": "user", "content": content}], **kw)

    def error_of(self, status, data):
        self.assertEqual(set(json.loads(data)), {"error"}, data)
        err = json.loads(data)["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, data)
        self.assertTrue(err["message"])
        return err

    def test_chat(self):
        r = self.chat("Tell me a story.", max_tokens=24, temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertLessEqual(r.usage.completion_tokens, 24)

    def test_chat_stream_equals_whole(self):
        whole = self.chat("Once upon a time", max_tokens=30, temperature=0)
        chunks = list(self.chat("Once upon a time", max_tokens=30, temperature=0, stream=True,
                                stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(len({c.id for c in chunks}), 1)

    def test_completion_equals_generate(self):
        prompt = "Once upon a time"
        r = self.client.completions.create(model="stories260K.bin", prompt=prompt, max_tokens=20, temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 20)
        # generate echoes the prompt, runs the prompt's pass plus -n steps (n + 1 tokens) and ends with a newline.
        out = subprocess.run([self.lowbit, "generate", str(self.model_dir / "stories260K.bin"), "--tokenizer",
                              str(self.model_dir / "tok512.bin"), "-p", prompt, "-n", "19", "--temp", "0",
                              "--threads", "1", *DEVICE], capture_output=True, text=True, check=True).stdout
        self.assertEqual(prompt + r.choices[0].text + "\n", out)

    def test_completion_stream_and_logprobs(self):
        kw = dict(model="stories260K.bin", prompt="The dog", max_tokens=12, temperature=0, logprobs=2)
        whole = self.client.completions.create(**kw)
        parts = list(self.client.completions.create(stream=True, **kw))
        self.assertEqual("".join(p.choices[0].text for p in parts), whole.choices[0].text)
        lp = whole.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 12)
        self.assertEqual("".join(lp.tokens), whole.choices[0].text)
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(logprob, 0)
            self.assertEqual(len(top), 2)
            self.assertAlmostEqual(max(top.values()), logprob, places=5)  # greedy: the most likely token

    def test_chat_logprobs(self):
        r = self.chat("Hi", max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for c in content:
            self.assertEqual(len(c.top_logprobs), 3)
            self.assertEqual(c.top_logprobs[0].token, c.token)
            self.assertEqual(bytes(c.bytes).decode("utf-8", "replace"), c.token)

    def test_stop_strings(self):
        full = self.client.completions.create(model="stories260K.bin", prompt="Once upon a time", max_tokens=30,
                                              temperature=0).choices[0].text
        word = full.split()[3]
        cut = self.client.completions.create(model="stories260K.bin", prompt="Once upon a time", max_tokens=30,
                                             temperature=0, stop=["zzz", word])
        self.assertEqual(cut.choices[0].text, full[:full.index(word)])
        self.assertEqual(cut.choices[0].finish_reason, "stop")

    def test_seeded_sampling_repeats(self):
        kw = dict(max_tokens=20, temperature=1.0, top_p=0.9, seed=42, extra_body={"top_k": 40, "min_p": 0.01})
        a, b = self.chat("Hi", **kw), self.chat("Hi", **kw)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)
        self.assertTrue(a.choices[0].message.content)

    def test_models_health_metrics(self):
        self.assertEqual([m.id for m in self.client.models.list()], ["stories260K.bin"])
        status, data = self.server.raw("GET", "/health")
        self.assertEqual((status, json.loads(data)), (200, {"status": "ok"}))
        self.chat("Hi", max_tokens=3, temperature=0)
        status, data = self.server.raw("GET", "/metrics")
        self.assertEqual(status, 200)
        metrics = dict(line.split(" ", 1) for line in data.decode().splitlines() if not line.startswith("#"))
        for name in ("lowbit_requests_total", "lowbit_generated_tokens_total", "lowbit_queue_length",
                     "lowbit_batch_size", "lowbit_decode_tokens_per_second"):
            self.assertIn(name, metrics)
        self.assertGreaterEqual(int(metrics["lowbit_requests_total"]), 1)
        self.assertGreater(float(metrics["lowbit_decode_tokens_per_second"]), 0)

    def test_client_errors(self):
        o = self.openai
        bad = o.OpenAI(base_url=self.server.url(), api_key="wrong", max_retries=0)
        with self.assertRaises(o.AuthenticationError) as e:
            bad.models.list()
        self.assertEqual(e.exception.code, "invalid_api_key")
        with self.assertRaises(o.AuthenticationError):
            bad.chat.completions.create(model="stories260K.bin", messages=[{"role": "user", "content": "x"}])
        with self.assertRaises(o.BadRequestError) as e:
            self.chat("Hi", n=2)
        self.assertEqual(e.exception.body["param"], "n")
        with self.assertRaises(o.NotFoundError) as e:
            self.client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.code, "model_not_found")
        with self.assertRaises(o.BadRequestError) as e:
            self.client.completions.create(model="stories260K.bin", prompt="the dog ran " * 400)
        self.assertEqual(e.exception.code, "context_length_exceeded")
        with self.assertRaises(o.BadRequestError) as e:
            self.chat("Hi", response_format={"type": "json_object"})
        self.assertIn("not implemented", e.exception.message)
        with self.assertRaises(o.BadRequestError):
            self.chat("Hi", max_tokens=100000)
        with self.assertRaises(o.BadRequestError) as e:
            self.chat("RAISE")
        self.assertIn("no RAISE here", e.exception.message)

    def test_tools_and_roles(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]
        plain = self.chat("Hi", max_tokens=8, temperature=0)
        # This template ignores tools and stories260K writes no <tool_call>: the reply stays content, whole or streamed.
        whole = self.chat("Hi", max_tokens=8, temperature=0, tools=tools)
        self.assertEqual(whole.choices[0].message.content, plain.choices[0].message.content)
        self.assertIsNone(whole.choices[0].message.tool_calls)
        chunks = list(self.chat("Hi", max_tokens=8, temperature=0, tools=tools, stream=True))
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), plain.choices[0].message.content)
        self.assertEqual(chunks[-1].choices[0].finish_reason, plain.choices[0].finish_reason)
        developer = self.client.chat.completions.create(
            model="stories260K.bin", max_tokens=8, temperature=0,
            messages=[{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "Hi"}])
        system = self.client.chat.completions.create(
            model="stories260K.bin", max_tokens=8, temperature=0,
            messages=[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}])
        self.assertEqual(developer.usage.prompt_tokens, system.usage.prompt_tokens)
        self.assertEqual(developer.choices[0].message.content, system.choices[0].message.content)

    def test_malformed_requests(self):
        cases = [
            ("/v1/chat/completions", b"{not json", None),
            ("/v1/chat/completions", b"", None),
            ("/v1/chat/completions", b"[1, 2]", None),
            ("/v1/chat/completions", b'{"model": "stories260K.bin"}', "messages"),
            ("/v1/chat/completions", b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "model"),
            ("/v1/chat/completions", b'{"model": "stories260K.bin", "messages": "hi"}', "messages"),
            ("/v1/chat/completions", b'{"model": "stories260K.bin", "messages": [{"role": "robot", "content": "x"}]}',
             "messages"),
            ("/v1/chat/completions", b'{"model": "stories260K.bin", "messages": [{"role": "user", "content": 7}]}',
             "messages"),
            ("/v1/chat/completions", b'{"model": "stories260K.bin", "messages": [{"role": "user", "content": "x"}], '
             b'"tools": {"type": "function"}}', "tools"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "max_tokens": "5"}', "max_tokens"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "max_tokens": -1}', "max_tokens"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "temperature": "hot"}', "temperature"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "temperature": 1e999}', None),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "stop": 5}', "stop"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "stream": "yes"}', "stream"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "seed": 1.5}', "seed"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "logprobs": 9}', "logprobs"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": ["a", "b"]}', "prompt"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "a", "top_k": 18446744073709551615}', "top_k"),
            ("/v1/completions", b'{"model": "stories260K.bin", "prompt": "\xff\xfe"}', None),
        ]
        for path, body, param in cases:
            with self.subTest(body=body):
                status, data = self.server.raw("POST", path, body)
                self.assertEqual(status, 400, data)
                err = self.error_of(status, data)
                self.assertEqual(err["type"], "invalid_request_error")
                if param:
                    self.assertEqual(err["param"], param, data)
        status, data = self.server.raw("POST", "/v1/completions", b'{"prompt": "' + b"a" * 70000 + b'"}')
        self.assertEqual(status, 413)
        self.error_of(status, data)
        status, data = self.server.raw("GET", "/v2/nothing")
        self.assertEqual(status, 404)
        self.error_of(status, data)
        # Garbage on a raw socket, then a client that leaves mid-stream: the server answers afterwards.
        for garbage in (b"\x00\x01\x02 garbage\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99\r\n\r\n{",
                        b"GET " + b"A" * 20000 + b" HTTP/1.1\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as s:
                s.sendall(garbage)
                s.shutdown(socket.SHUT_WR)
                try:
                    s.recv(4096)
                except OSError:
                    pass
        for stream in (True, False):  # clients that leave after the status line, streamed and whole
            body = json.dumps({"model": "stories260K.bin", "prompt": "Once", "max_tokens": 400, "stream": stream})
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                          b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                          b"\r\n\r\n" + body.encode())
                self.assertIn(b"200", s.recv(64))
        self.assertEqual(self.server.raw("GET", "/health")[0], 200)
        r = self.chat("Hi", max_tokens=4, temperature=0)
        self.assertTrue(r.choices[0].message.content)
        # The slot of the client that left is free again.
        deadline = time.time() + 20
        while time.time() < deadline:
            metrics = self.server.raw("GET", "/metrics")[1].decode()
            if "\nlowbit_batch_size 0\n" in metrics:
                break
            time.sleep(0.05)
        self.assertIn("\nlowbit_batch_size 0\n", metrics)

    def test_load(self):
        """32 concurrent streaming clients, 64 greedy requests: each equals the same request alone."""
        prompts = ["Once upon a time", "The dog", "Lily and Tom", "One day, a bird", "Sam had a", "The sun",
                   "Mom said", "There was a big"]
        requests = [(prompts[i % len(prompts)], 8 + (i * 7) % 48, i % 2 == 0) for i in range(64)]
        alone = {}
        for prompt, max_tokens, is_chat in set(requests):
            alone[(prompt, max_tokens, is_chat)] = self.run_one(prompt, max_tokens, is_chat, stream=False)

        def streamed(req):
            return req, self.run_one(*req, stream=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(streamed, requests))
        self.assertEqual(len(results), 64)
        for req, got in results:
            self.assertEqual(got, alone[req], req)

    def run_one(self, prompt, max_tokens, is_chat, stream):
        """(text, finish_reason) of one greedy request; a stream is checked for its shape on the way."""
        if is_chat:
            r = self.chat(prompt, max_tokens=max_tokens, temperature=0, stream=stream)
            if not stream:
                return r.choices[0].message.content, r.choices[0].finish_reason
            chunks = list(r)
            self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
            finishes = [c.choices[0].finish_reason for c in chunks]
            self.assertTrue(all(f is None for f in finishes[:-1]) and finishes[-1], finishes)
            return "".join(c.choices[0].delta.content or "" for c in chunks), finishes[-1]
        r = self.client.completions.create(model="stories260K.bin", prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, stream=stream)
        if not stream:
            return r.choices[0].text, r.choices[0].finish_reason
        chunks = list(r)
        finishes = [c.choices[0].finish_reason for c in chunks]
        self.assertTrue(all(f is None for f in finishes[:-1]) and finishes[-1], finishes)
        return "".join(c.choices[0].text for c in chunks), finishes[-1]

    def test_port_in_use(self):
        r = subprocess.run([self.lowbit, "serve", str(self.model_dir / "stories260K.bin"), "--tokenizer",
                            str(self.model_dir / "tok512.bin"), "--port", str(self.server.port)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(f"cannot listen on 127.0.0.1:{self.server.port}", r.stderr)

    def test_zz_sigterm_stops_cleanly(self):
        """Last (unittest runs tests by name): SIGTERM with a stream in flight ends the server with status 0."""
        body = json.dumps({"model": "stories260K.bin", "prompt": "Once", "max_tokens": 400, "stream": True})
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertEqual(self.server.stop(), 0)
        rest = resp.read().decode()  # the stream ends (finished, or an error event) rather than hanging
        conn.close()
        self.assertTrue(rest.endswith("data: [DONE]\n\n") or rest == "", rest[-200:])
        self.server.drain.join(timeout=10)
        self.assertIn("[serve] stopped\n", self.server.lines)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ServeTest.lowbit, ServeTest.shared, ServeTest.cache = sys.argv[1:4]
    if not (pathlib.Path(ServeTest.shared) / "models" / "stories260K" / "stories260K.bin").exists():
        skip(f"{ServeTest.shared}/models/stories260K is absent")
    import_openai(ServeTest.cache)  # skips (77) before any test runs when PyPI is unreachable
    unittest.main(argv=sys.argv[:1], verbosity=2)

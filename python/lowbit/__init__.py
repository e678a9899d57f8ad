"""lowbit from Python: load and run models, evaluate, quantize, verify and inspect artifacts.

Every call goes to the same C++ library the `lowbit` command runs; a failure raises lowbit.Error (a subclass per
exit status: UsageError 2, InvalidInputError 3, Error 1) with the command's one-line message, the error code's
name in `.code` (e.g. "missing_file") and the exit status in `.exit_code`.
"""
import json
import queue
import threading
from pathlib import Path

from . import _lowbit

__all__ = ["Error", "UsageError", "InvalidInputError", "Model", "load", "eval_ppl", "eval_kld", "quantize",
           "verify", "inspect", "set_threads"]


class Error(Exception):
    """A lowbit::Error: `code` is the Errc name, `exit_code` what the CLI would exit with."""

    def __init__(self, message, code, exit_code):
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


class UsageError(Error):
    """A call lowbit cannot make sense of (the CLI exits 2)."""


class InvalidInputError(Error):
    """A model, artifact or text file that fails lowbit's checks (the CLI exits 3)."""


def _raise_error(code, exit_code, message):
    cls = {2: UsageError, 3: InvalidInputError}.get(exit_code, Error)
    raise cls(message, code, exit_code)


_lowbit._set_error_hook(_raise_error)


def set_threads(n):
    """Threads of the process-wide pool (default: all cores); only before the first model runs."""
    _lowbit.set_threads(n)


def _sampler(temperature, top_k, top_p, min_p, seed):
    s = _lowbit.SamplerOptions()
    s.temperature, s.top_k, s.top_p, s.min_p, s.seed = temperature, top_k, top_p, min_p, seed
    return s


class _Stop(BaseException):
    """Raised inside the piece callback to end a generation early (a stop string, the iterator closed)."""


class Model:
    """A loaded model and its tokenizer (lowbit.load)."""

    def __init__(self, loaded):
        self._loaded = loaded
        self.stats = None  # the last generation's counts and timings

    @property
    def path(self):
        return Path(self._loaded.path)

    def generate(self, prompt, max_tokens=256, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=0,
                 stop=None, echo=False):
        """Streams the continuation of `prompt` as text pieces (whole UTF-8 characters).

        Stops at an end-of-sequence token, after max_tokens new tokens, at the context length, or just before the
        first of the `stop` strings (text that may begin one is held back until it is known not to).
        """
        options = _lowbit.GenerateOptions()
        options.prompt = prompt
        # generate() counts decode steps after the prompt's own prediction: steps + 1 new tokens at most.
        options.steps = max(max_tokens - 1, 0)
        options.echo_prompt = echo
        options.sampler = _sampler(temperature, top_k, top_p, min_p, seed)
        # generate() writes a "\n" after the last token, as run.c does; it is no part of the continuation.
        return self._stream(lambda emit: _lowbit.generate(self._loaded, options, emit), stop, max_tokens,
                            drop_final_newline=True)

    def complete(self, prompt, **kwargs):
        """generate(), joined into one string."""
        return "".join(self.generate(prompt, **kwargs))

    def chat(self, messages, stream=False, max_tokens=256, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
             seed=0, stop=None, chat_template=None):
        """The assistant's reply to OpenAI-style `messages` ([{"role": ..., "content": ...}, ...], the last one the
        user's), rendered with the model's own chat template and ended at its end-of-turn tokens, as `lowbit chat`
        does; a string, or with stream=True an iterator of pieces. chat_template: Jinja source used instead.
        """
        history = [(m["role"], m["content"]) for m in messages]
        sampler = _sampler(temperature, top_k, top_p, min_p, seed)
        pieces = self._stream(lambda emit: _lowbit.chat(self._loaded, history, chat_template, sampler, max_tokens,
                                                             emit), stop,
                              max_tokens, drop_final_newline=False)
        return pieces if stream else "".join(pieces)

    def _stream(self, run_cpp, stop, max_tokens, drop_final_newline):
        # The C++ generation runs on its own thread without the GIL; each piece crosses through a queue, so the
        # caller's loop can be slow, break early (the generation is then stopped at its next piece) or run others.
        if max_tokens <= 0:
            return
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        pieces = queue.Queue(maxsize=64)
        closed = threading.Event()
        done = object()
        outcome = {}

        def emit(piece):
            if closed.is_set():
                raise _Stop()
            pieces.put(piece)

        def run():
            try:
                outcome["stats"] = run_cpp(emit)
            except _Stop:
                pass
            except BaseException as e:  # re-raised on the caller's thread
                outcome["error"] = e
            pieces.put(done)

        def received():
            # With drop_final_newline each piece is held back until the next one shows it was not the last one.
            held = None
            while True:
                piece = pieces.get()
                if piece is done:
                    if held is not None and not (drop_final_newline and held == b"\n" and "stats" in outcome):
                        yield held
                    return
                if held is not None:
                    yield held
                held = piece

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        pending = b""  # bytes not yet valid UTF-8
        unsent = ""  # text held back because it may be the start of a stop string
        try:
            for piece in received():
                pending += piece
                try:
                    unsent += pending.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # an invalid byte the stream passed alone: decoded with replacement at the end
                pending = b""
                hits = [unsent.find(s) for s in stops if s in unsent]
                if hits:
                    if min(hits) > 0:
                        yield unsent[: min(hits)]
                    unsent = ""
                    break
                keep = max((n for s in stops for n in range(len(s) - 1, 0, -1) if unsent.endswith(s[:n])), default=0)
                if len(unsent) > keep:
                    yield unsent[: len(unsent) - keep]
                    unsent = unsent[len(unsent) - keep:]
            tail = unsent + pending.decode("utf-8", errors="replace")
            if tail:
                yield tail
        finally:
            closed.set()
            while worker.is_alive():  # a worker blocked on the full queue: drain it so that it sees `closed`
                try:
                    pieces.get(timeout=0.01)
                except queue.Empty:
                    pass
            worker.join()
        if "error" in outcome:
            raise outcome["error"]
        self.stats = outcome.get("stats")


def load(path, tokenizer=None, device="cpu"):
    """Loads a llama2.c .bin, Hugging Face directory, GGUF file or lowbit artifact, as `lowbit generate` does."""
    return Model(_lowbit.load(Path(path), None if tokenizer is None else Path(tokenizer), device))


def eval_ppl(model_path, text_path, ctx=512, tokenizer=None, device="cpu"):
    """Perplexity by llama.cpp's method; the dict `lowbit eval ppl --json` prints."""
    return _lowbit.eval_ppl(Path(model_path), Path(text_path), ctx, None if tokenizer is None else Path(tokenizer),
                            device)


def eval_kld(base, other, text_path, ctx=512, tokenizer=None, device="cpu"):
    """KL divergence of `other` from `base`; the dict `lowbit eval kld --json` prints."""
    return _lowbit.eval_kld(Path(base), Path(other), Path(text_path), ctx,
                            None if tokenizer is None else Path(tokenizer), device)


def quantize(src, out, preset="affine4", calib=None, force=False, seed=0):
    """Quantizes `src` into the artifact directory `out` with a built-in recipe preset; the report dict.

    calib=None: plain rounding (the CLI's --no-calib); a text file path: Hessian-aware with that calibration text.
    """
    return _lowbit.quantize(Path(src), Path(out), preset, None if calib is None else Path(calib), force, seed)


def verify(path, verify_hash=True):
    """Every check `lowbit verify` makes on an artifact; {"tensors", "files", "bytes"}, or raises lowbit.Error."""
    return _lowbit.verify(Path(path), verify_hash)


def inspect(path, verify_hash=True):
    """The dict `lowbit inspect --json` prints: tensors, codecs, bits per weight, files, totals, config."""
    return _lowbit.inspect(Path(path), verify_hash)

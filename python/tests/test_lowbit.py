"""The lowbit Python package against the library it wraps: run by ctest (python_tests) with PYTHONPATH at the
built module, LOWBIT_CLI at the lowbit binary and LOWBIT_SHARED_DIR at ../shared."""
import json
import os
import subprocess
from pathlib import Path

import pytest

import lowbit

SHARED = Path(os.environ.get("LOWBIT_SHARED_DIR", Path(__file__).resolve().parents[2] / ".." / "shared"))
STORIES = SHARED / "models" / "stories260K"
TEXT = SHARED / "data" / "tinystories-valid-excerpt.txt"
needs_stories = pytest.mark.skipif(not (STORIES / "stories260K.bin").is_file(),
                                   reason=f"needs {STORIES} (../shared absent)")


@pytest.fixture(scope="module")
def stories():
    return lowbit.load(STORIES / "stories260K.bin", tokenizer=STORIES / "tok512.bin")


@needs_stories
def test_greedy_generation_streams_pieces_that_join_to_the_whole(stories):
    pieces = list(stories.generate("Once upon a time", max_tokens=24, temperature=0))
    assert len(pieces) > 1
    text = "".join(pieces)
    assert text.strip()
    assert stories.stats["generated_tokens"] <= 24
    # Greedy decoding is deterministic: the non-streaming call gives the same text.
    assert stories.complete("Once upon a time", max_tokens=24, temperature=0) == text


@needs_stories
def test_echo_puts_the_prompt_first(stories):
    text = stories.complete("Once upon a time", max_tokens=8, temperature=0, echo=True)
    assert text.startswith("Once upon a time")


@needs_stories
def test_a_stop_string_ends_the_text_before_it(stories):
    full = stories.complete("Once upon a time", max_tokens=48, temperature=0)
    words = full.split()
    assert len(words) > 3
    stop = " " + words[2]
    cut = stories.complete("Once upon a time", max_tokens=48, temperature=0, stop=[stop])
    assert cut == full[: full.index(stop)]


@needs_stories
def test_seeded_sampling_repeats_and_the_seed_matters(stories):
    def sample(seed):
        return stories.complete("Lily", max_tokens=32, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1


@needs_stories
def test_breaking_out_of_the_stream_stops_the_generation(stories):
    stream = stories.generate("Once upon a time", max_tokens=200, temperature=0)
    first = next(stream)
    stream.close()
    assert first
    # The model is free again for the next call.
    assert stories.complete("Tom", max_tokens=4, temperature=0)


@needs_stories
def test_chat_uses_the_given_template_and_refuses_a_model_without_one(stories):
    with pytest.raises(lowbit.Error) as info:
        stories.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
    assert info.value.code == "unsupported"
    template = "{% for m in messages %}{{ m.content }} {% endfor %}"
    messages = [{"role": "system", "content": "Once upon a time"}, {"role": "user", "content": "there was"}]
    reply = stories.chat(messages, max_tokens=16, temperature=0, chat_template=template)
    assert reply and stories.stats["generated_tokens"] <= 16
    assert stories.stats["prompt_tokens"] > 0
    assert "".join(stories.chat(messages, stream=True, max_tokens=16, temperature=0,
                                chat_template=template)) == reply


def test_a_missing_model_raises_the_cli_message_and_code(tmp_path):
    missing = tmp_path / "no-such-model.bin"
    with pytest.raises(lowbit.Error) as info:
        lowbit.load(missing)
    assert str(missing) in str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.exit_code in (1, 2, 3)
    assert isinstance(info.value.code, str) and info.value.code


def test_a_corrupt_artifact_is_invalid_input(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(lowbit.InvalidInputError) as info:
        lowbit.verify(tmp_path)
    assert info.value.exit_code == 3
    assert info.value.code == "format"
    assert "manifest.json" in str(info.value)


def test_an_unknown_preset_is_a_usage_error(tmp_path):
    with pytest.raises(lowbit.UsageError) as info:
        lowbit.quantize(tmp_path / "src", tmp_path / "out", preset="no-such-preset")
    assert "no-such-preset" in str(info.value)
    assert info.value.exit_code == 2


@needs_stories
@pytest.mark.skipif(not TEXT.is_file(), reason=f"needs {TEXT}")
def test_eval_ppl_returns_the_json_fields_of_the_cli(tmp_path):
    text = tmp_path / "excerpt.txt"  # the excerpt's first 8 KiB: a few windows, enough to compare with the CLI
    text.write_bytes(TEXT.read_bytes()[:8192])
    r = lowbit.eval_ppl(STORIES / "stories260K.bin", text, ctx=128, tokenizer=STORIES / "tok512.bin")
    assert set(r) == {"ppl", "ppl_stderr", "nll_mean", "tokens", "windows", "ctx"}
    assert r["ctx"] == 128 and r["windows"] >= 1
    assert r["tokens"] == r["windows"] * (128 - 1 - 64)
    assert 1.0 < r["ppl"] < 512  # better than uniform over the 512-token vocabulary
    cli = os.environ.get("LOWBIT_CLI")
    if cli:
        out = subprocess.run([cli, "eval", "ppl", str(STORIES / "stories260K.bin"), "--text", str(text), "--ctx", "128",
                              "--tokenizer", str(STORIES / "tok512.bin"), "--json"],
                             check=True, capture_output=True, text=True).stdout
        assert json.loads(out) == r


def test_verify_a_demo_artifact(tmp_path):
    cli = os.environ.get("LOWBIT_CLI")
    if not cli:
        pytest.skip("LOWBIT_CLI (the lowbit binary that writes the demo artifact) not set")
    art = tmp_path / "demo"
    subprocess.run([cli, "demo-artifact", str(art), "--tensors", "3"], check=True, capture_output=True)
    r = lowbit.verify(art)
    assert r["tensors"] == 3 and r["bytes"] > 0
    doc = lowbit.inspect(art)
    assert len(doc["tensors"]) == 3 and doc["totals"]["tensors"] == 3
    assert doc["totals"]["artifact_bytes"] == r["bytes"]
    out = subprocess.run([cli, "inspect", str(art), "--json"], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == doc

#!/usr/bin/env python3
"""Random-weight Qwen3-ASR model and the reference outputs lowbit transcribe is tested against (issue 24).

Builds transformers' Qwen3ASRForConditionalGeneration (transformers >= 5, CPU torch) with the real config's
structure cut to 2 encoder and 2 decoder layers and small widths, weights drawn at scales that give clear greedy
margins, and saves it as an HF directory under .cache/qwen3_asr_fixture (git-ignored: models are never committed)
with the Qwen3 tokenizer of ../shared/tokenizers/qwen3 plus Qwen3-ASR's audio tokens. Every weight comes from the
counter-based generator of scripts/counter_rng.py (uniform; the stream of a tensor is its name in model.safetensors),
which tests/model/counter_rng.h implements too: with the small files committed under model/ and phonon/ below,
tests/model/qwen3_asr_test.cpp writes the same model.safetensors byte for byte (expected.json's model_sha256) and
the Phonon copy where torch is absent (CI).
Speech comes from espeak-ng (Debian), resampled to 16 kHz with python-soxr and stored as 16-bit PCM.

Committed under tests/model/fixtures/qwen3_asr/: model/ (config.json, preprocessor_config.json,
generation_config.json, weights.json: the seed and every tensor's name, shape, kind and amplitude, and
added_tokens.json: the entries appended to the Qwen3 tokenizer's added_tokens),
phonon/ (config.json, packed_manifest.json), speech.wav and expected.json, which holds slices of the
reference's log-mel features and projected encoder output, the prompt ids and the greedy token ids, and where
mlx_audio's split_audio_into_chunks (pip install mlx-audio) cuts the speech repeated into long audio. The prompt is
mlx_audio's Qwen3-ASR prompt (the original implementation's): an empty system turn, the audio placeholders, the
assistant turn.

The same weights are also written as a Phonon directory (.cache/qwen3_asr_fixture_phonon: mlx_audio's names and
conv layout, dense decoder linears), which must transcribe to the same ids.

Usage: scripts/make_qwen3_asr_fixtures.py [--model-only]   (--model-only rewrites only the git-ignored model,
which the same seed makes identical; expected.json records its weights' SHA-256 to prove it)
"""
import argparse
import hashlib
import json
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile
import wave

import numpy as np
import soxr
import torch
import transformers
from transformers import Qwen3ASRConfig, Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import counter_rng  # noqa: E402

MODEL_DIR = ROOT / ".cache" / "qwen3_asr_fixture"
PHONON_DIR = ROOT / ".cache" / "qwen3_asr_fixture_phonon"
FIXTURES = ROOT / "tests" / "model" / "fixtures" / "qwen3_asr"
TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "qwen3"
if not TOKENIZER.exists():
    TOKENIZER = ROOT / ".." / ".." / "shared" / "tokenizers" / "qwen3"
SEED = 0x5EED0024
# amplitudes of the uniform draws: gains 1 +- GAIN, biases +- BIAS, embeddings and lm_head +- EMBED (unit
# variance), every other weight +- sqrt(3 / fan_in) (variance 1 / fan_in)
GAIN, BIAS, EMBED = 0.2, 0.2, math.sqrt(3.0)
TEXT = "Hello world, this is a test of lowbit."
GREEDY_TOKENS = 32
# Qwen3-ASR's tokens beyond Qwen3's vocabulary, at the real tokenizer's ids.
AUDIO_TOKENS = {"<|audio_start|>": 151669, "<|audio_end|>": 151670, "<|audio_pad|>": 151676, "<asr_text>": 151704}
EOS = [151643, 151645]


def config() -> Qwen3ASRConfig:
    return Qwen3ASRConfig(
        audio_config={
            "num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128,
            "d_model": 64, "output_dim": 128, "n_window": 50,
            # two 100-frame chunks per attention window, so a 2.5 s clip spans two windows
            "n_window_infer": 200, "downsample_hidden_size": 32, "max_position_embeddings": 13,
        },
        text_config={
            "vocab_size": 151936, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        },
        # untied: a random tied head maps each token's own embedding back to it, and greedy decoding repeats it
        audio_token_id=AUDIO_TOKENS["<|audio_pad|>"], eos_token_id=EOS, tie_word_embeddings=False,
    )


def weight_specs(model: torch.nn.Module) -> list[dict]:
    """Every tensor's name, shape, kind (g: gain, drawn 1 + sym; b: bias; w: weight) and amplitude, at scales where
    activations stay O(1): a default 0.02 init leaves greedy margins near rounding."""
    specs = []
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("ln_post.weight"):
            kind, amp = "g", GAIN
        elif p.dim() == 1:
            kind, amp = "b", BIAS
        elif "embed_tokens" in name or name == "lm_head.weight":
            kind, amp = "w", EMBED
        else:
            kind, amp = "w", math.sqrt(3.0 / p[0].numel())
        specs.append({"name": name, "shape": list(p.shape), "kind": kind, "amp": amp})
    return specs


def values(spec: dict) -> np.ndarray:
    v = counter_rng.sym(SEED, spec["name"], math.prod(spec["shape"]), spec["amp"])
    return (v + np.float32(1) if spec["kind"] == "g" else v).reshape(spec["shape"])


def redraw(model: torch.nn.Module, specs: list[dict]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for spec in specs:
            params[spec["name"]].copy_(torch.from_numpy(values(spec)))


def added_tokens(tok: dict) -> list[dict]:
    """tokenizers numbers added tokens consecutively, so the ids between the audio tokens get stand-ins."""
    by_id = {i: content for content, i in AUDIO_TOKENS.items()}
    first = max(t["id"] for t in tok["added_tokens"]) + 1
    return [{"id": i, "content": by_id.get(i, f"<|asr_reserved_{i}|>"), "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True} for i in range(first, max(by_id) + 1)]


def write_tokenizer(out: pathlib.Path) -> None:
    tok = json.loads((TOKENIZER / "tokenizer.json").read_text())
    tok["added_tokens"] += added_tokens(tok)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    shutil.copy(TOKENIZER / "tokenizer_config.json", out / "tokenizer_config.json")


def make_model() -> tuple[pathlib.Path, list[dict]]:
    model = Qwen3ASRForConditionalGeneration(config()).eval()
    specs = weight_specs(model)
    redraw(model, specs)
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)
    model.save_pretrained(MODEL_DIR)
    from safetensors import safe_open
    with safe_open(str(MODEL_DIR / "model.safetensors"), "pt") as f:
        if sorted(f.keys()) != sorted(s["name"] for s in specs) or f.metadata() != {"format": "pt"}:
            raise SystemExit("model.safetensors holds other tensors or metadata than the parameters drawn")
    Qwen3ASRFeatureExtractor(n_window=50).save_pretrained(MODEL_DIR)
    write_tokenizer(MODEL_DIR)
    (MODEL_DIR / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}) + "\n")
    return MODEL_DIR, specs


def commit_model_files(model_dir: pathlib.Path, specs: list[dict]) -> None:
    """The small files from which the C++ test rebuilds both model directories (with the tokenizer files of
    ../shared/tokenizers/qwen3 there too)."""
    for sub, names in (("model", ("config.json", "preprocessor_config.json", "generation_config.json")),
                       ("phonon", ("config.json", "packed_manifest.json"))):
        (FIXTURES / sub).mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copy((model_dir if sub == "model" else PHONON_DIR) / name, FIXTURES / sub / name)
    weights = {"generator": "scripts/counter_rng.py", "seed": SEED, "metadata": {"format": "pt"}, "tensors": specs}
    (FIXTURES / "model" / "weights.json").write_text(json.dumps(weights, indent=1) + "\n")
    tok = json.loads((TOKENIZER / "tokenizer.json").read_text())
    (FIXTURES / "model" / "added_tokens.json").write_text(json.dumps(added_tokens(tok), indent=1) + "\n")


def make_phonon(model_dir: pathlib.Path) -> pathlib.Path:
    """The same weights as a Phonon directory (seed 000's layout: mlx_audio names, MLX conv layout, a
    packed_manifest.json), with every decoder linear left dense (module_count 0), so it must transcribe alike."""
    from safetensors.torch import load_file, save_file
    hf = load_file(str(model_dir / "model.safetensors"))
    out = {}
    for name, t in hf.items():
        if name.startswith("model.language_model."):
            out["model." + name[len("model.language_model."):]] = t
        elif name == "lm_head.weight":
            out[name] = t
        elif name.startswith("model.audio_tower."):
            local = "audio_tower." + name[len("model.audio_tower."):]
            out[local] = t.permute(0, 2, 3, 1).contiguous() if ".conv2d" in local and local.endswith("weight") else t
        elif name.startswith("model.multi_modal_projector.linear_"):
            out[name.replace("model.multi_modal_projector.linear_", "audio_tower.proj")] = t
        else:
            raise SystemExit(f"unexpected tensor {name}")
    if PHONON_DIR.exists():
        shutil.rmtree(PHONON_DIR)
    PHONON_DIR.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(PHONON_DIR / "model.safetensors"), metadata={"format": "mlx"})
    cfg = json.loads((model_dir / "config.json").read_text())
    text = dict(cfg["text_config"])
    text["rope_theta"] = text.pop("rope_parameters")["rope_theta"]
    thinker = {"audio_config": cfg["audio_config"], "text_config": text, "audio_token_id": cfg["audio_token_id"]}
    (PHONON_DIR / "config.json").write_text(json.dumps({"model_type": "qwen3_asr", "thinker_config": thinker}, indent=1))
    (PHONON_DIR / "packed_manifest.json").write_text(json.dumps(
        {"status": "PASS", "group_size": 128, "bits": 2, "module_count": 0, "modules": []}, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json"):
        shutil.copy(model_dir / name, PHONON_DIR / name)
    return PHONON_DIR


def make_speech(path: pathlib.Path) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        raw = pathlib.Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", "en", "-s", "170", "-w", str(raw), TEXT], check=True)
        with wave.open(str(raw)) as w:
            assert w.getnchannels() == 1 and w.getsampwidth() == 2, "espeak-ng writes mono 16-bit"
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    y = soxr.resample(x, rate, 16000, quality="HQ")
    pcm = np.clip(np.round(y * 32768), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return pcm.astype(np.float32) / 32768


def read_speech(path: pathlib.Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768


def prompt_ids(tokenizer, n_audio: int, language: str | None) -> list[int]:
    prefix = f"language {language}<asr_text>" if language else ""
    text = ("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>" + "<|audio_pad|>" * n_audio +
            "<|audio_end|><|im_end|>\n<|im_start|>assistant\n" + prefix)
    return tokenizer.encode(text).ids


def greedy(model, ids: list[int], features, mask) -> tuple[list[int], float]:
    """Greedy continuation without the final EOS, and the smallest top-1 / top-2 logit gap on the way."""
    out, margin = [], float("inf")
    with torch.no_grad():
        seq = torch.tensor([ids])
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=seq, input_features=features, input_features_mask=mask).logits[0, -1]
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            nxt = int(torch.argmax(logits))
            if nxt in EOS:
                break
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    return out, margin


def chunk_starts(speech: np.ndarray) -> list[dict]:
    """mlx_audio's split of long audio: the first sample of each chunk, for the speech repeated, in short chunks."""
    from mlx_audio.stt.models.qwen3_asr.qwen3_asr import split_audio_into_chunks
    out = []
    for repeat, seconds in ((1, 1.0), (3, 2.0), (8, 4.5)):
        wav = np.tile(speech, repeat)
        starts = [round(offset * 16000) for _, offset in split_audio_into_chunks(wav, 16000, chunk_duration=seconds)]
        out.append({"repeat": repeat, "seconds": seconds, "starts": starts})
    return out


def weights_sha256(directory: pathlib.Path) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-only", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    model_dir, specs = make_model()
    print(f"model: {model_dir} ({weights_sha256(model_dir)}); Phonon layout: {make_phonon(model_dir)}")
    if args.model_only:
        return
    FIXTURES.mkdir(parents=True, exist_ok=True)
    commit_model_files(model_dir, specs)
    speech = make_speech(FIXTURES / "speech.wav")

    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = Qwen3ASRForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    fe = Qwen3ASRFeatureExtractor.from_pretrained(model_dir)
    feats = fe(speech, sampling_rate=16000, padding=True, return_attention_mask=True, return_tensors="pt")
    features, mask = feats["input_features"], feats["attention_mask"]
    with torch.no_grad():
        audio = model.model.get_audio_features(features, mask, return_dict=True)
    projected = audio.pooler_output  # [n_audio, output_dim]
    n_audio = projected.shape[0]
    mel = features[0].numpy()  # [bins, padded_frames]
    frames = int(mask.sum())
    mel_slice = [40, 48]

    expected = {
        "generator": "scripts/make_qwen3_asr_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "model_sha256": weights_sha256(model_dir),
        "audio": "speech.wav", "samples": int(speech.shape[0]),
        "mel": {"bins": int(mel.shape[0]), "frames": frames, "padded_frames": int(mel.shape[1]),
                "slice_frames": mel_slice, "slice": mel[:, mel_slice[0]:mel_slice[1]].T.flatten().tolist(),
                "sum": float(mel.astype(np.float64).sum())},
        "encoder": {"tokens": int(n_audio), "dim": int(projected.shape[1]),
                    "rows": [0, 1, 12, 13, int(n_audio) - 1],
                    "slice": projected[[0, 1, 12, 13, n_audio - 1]].flatten().tolist(),
                    "sum": float(projected.double().sum())},
    }
    for key, language in (("auto", None), ("english", "English")):
        ids = prompt_ids(tokenizer, n_audio, language)
        tokens, margin = greedy(model, ids, features, mask)
        expected[key] = {"language": language, "prompt_ids": ids, "token_ids": tokens,
                         "text": tokenizer.decode(tokens, skip_special_tokens=False), "min_top2_margin": margin}
        print(f"{key}: {len(tokens)} tokens, smallest top-2 margin {margin:.4f}")
    expected["chunks"] = chunk_starts(speech)
    (FIXTURES / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {FIXTURES}/speech.wav ({speech.shape[0]} samples) and expected.json; "
          f"mel frames {frames}, audio tokens {n_audio}")


if __name__ == "__main__":
    main()

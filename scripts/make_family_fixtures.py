#!/usr/bin/env python3
"""Writes the per-family reference fixtures of tests/model/fixtures/families/ from Hugging Face transformers.

Regenerate (CPU only, a few seconds):
    python3 -m pip install torch transformers safetensors      # CPU torch is enough
    python3 scripts/make_family_fixtures.py                     # writes tests/model/fixtures/families/<family>/
    python3 scripts/make_family_fixtures.py --check             # reloads and re-verifies each fixture
  with the GGUF variants (llama, gemma2, gemma3, phi3, qwen3_moe, mixtral), converted by llama.cpp's own converter classes:
    python3 -m pip download --no-binary :all: --no-deps llama-cpp-python -d /tmp/lcpp   # 0.3.36 used
    tar xzf /tmp/lcpp/llama_cpp_python-*.tar.gz -C /tmp/lcpp && python3 -m pip install sentencepiece
    python3 scripts/make_family_fixtures.py --llama-cpp /tmp/lcpp/llama_cpp_python-*/vendor/llama.cpp
  with mlx-lm 4-bit checkpoints of the MoE families (tests/model/fixtures/mlx/<family>/, see write_mlx):
    python3 -m pip install "mlx[cpu]" mlx-lm      # mlx 0.32.4, mlx-lm 0.32.2 used
    python3 scripts/make_family_fixtures.py --mlx -- qwen3_moe mixtral
Made with torch 2.15.0 (the +cu132 wheel, run on CPU), transformers 5.25.0, safetensors 0.8.0, Python 3.11.7, as
recorded in each expected.safetensors' metadata (`generated_by`). Regenerating with the same versions reproduces the
files byte for byte; other versions may differ in the last bits, which --check reports.

Each tests/model/fixtures/families/<family>/ holds a tiny randomly initialised model (fixed seeds) as a Hugging Face
directory, config.json (classic field names: rope_theta, rope_scaling, rope_local_base_freq, as the published
checkpoints have them, not transformers 5's rope_parameters) and model.safetensors (bf16), plus expected.safetensors:
    tokens  int32 [24]        a fixed token sequence, longer than every sliding window
    logits  f32 [24, vocab]   one float32 forward over all 24 tokens, attn_implementation="eager"
    greedy  int32 [16]        model.generate(do_sample=False) in float32 continuing `tokens` (never the eos id)
The weights were drawn from seeded normals, then rounded to bf16: the stored bf16 weights are exactly what the f32
reference computes with. Norm weights are drawn around 1 (gemma: w around 0, as its norms apply 1 + w; gemma's final
norm w around 2, so its small tied embeddings still give logits big enough for softcapping), so nothing is degenerate.
The script asserts, per family: the greedy continuation equals the argmax of an uncached forward over all 40 tokens;
no greedy step is a near tie (top-1 minus top-2 logit >= MIN_MARGIN), and in MoE families no token's choice of
experts is (k-th minus (k+1)-th routing probability >= MIN_ROUTING_MARGIN, every layer, prompt and continuation), so an implementation within 1e-4 relative of
`logits` must reproduce `greedy`; greedy has >= MIN_DISTINCT distinct ids (not one id repeated); and each feature in
the family's `ablations` matters (changing that config.json field moves some logit by more than BITE). A seed that
fails the greedy conditions is skipped for the next one (deterministically); the seed used is printed.
GGUF variants (--llama-cpp): model.gguf (bf16 matrices, f32 norms and rope factors, as the converter writes them;
a stub vocabulary since the fixtures have no tokenizer, see write_gguf). llama.cpp reads the gemma GGUFs as a
slightly different model than config.json says (no query_pre_attn_scalar in GGUF: scale 1/sqrt(head_dim); no gemma3
layer pattern: 6, so both layers slide), so gemma2 and gemma3 also get expected_gguf.safetensors, the HF logits and
greedy of that llama.cpp view (llama_cpp_gguf_view; it is in the file's metadata). For llama and phi3 the GGUF means
the same model and expected.safetensors applies (phi3: as long as the short rope factors are used, which HF does
for every position < original_max_position_embeddings 64; llama.cpp picks by context size).
Sizes (bytes): model.safetensors 118-143 K, model.gguf 122-137 K (qwen3_moe 140 K), expected*.safetensors 12.9 K, config.json < 1 K;
HF part of each directory <= 153 KiB, whole directory <= 287 KiB (gemma3 with both expectations).

Every family: 2 layers, hidden 64, 4 heads, 2 KV heads (GQA 2), head_dim 16 and intermediate 64 unless said
(qwen3: head_dim 32, intermediate 32; gemma3: head_dim 32, intermediate 16; to stay small), vocab 128,
max_position_embeddings 128, rms_norm_eps 1e-6 (phi3 1e-5), bos 1, eos 2, pad 0. What each fixture exercises, with
the transformers config fields ("ablation-checked": the script verifies the feature changes the logits):
  llama    LlamaForCausalLM; untied lm_head (tie_word_embeddings false); rope_theta 500000 with rope_scaling
           {rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 64}:
           head_dim 16 has wavelengths in all three llama3 regimes (kept, smoothed, divided by factor);
           ablation-checked.
  mistral  MistralForCausalLM; untied; rope_theta 1e6; sliding_window 4096 (larger than any context here, as in
           Mistral 7B v0.1; full causal attention is exact).
  qwen2    Qwen2ForCausalLM; q/k/v biases (always on in Qwen2, no o bias); tied embeddings; rope_theta 1e6;
           use_sliding_window false.
  qwen3    Qwen3ForCausalLM; head_dim 32 (4 heads x 32 = 128 != hidden 64); q_norm/k_norm (RMSNorm per head, before
           RoPE); no biases (attention_bias false); tied embeddings; rope_theta 1e6.
  gemma2   Gemma2ForCausalLM; tied; layer_types left out as in the published checkpoints (default: even layers
           sliding, so layer 0 sliding, layer 1 full); sliding_window 6; query_pre_attn_scalar 24 (!= head_dim 16);
           attn_logit_softcapping 5.0 and final_logit_softcapping 3.0 and the window, each ablation-checked
           (pre-cap final logits reach 4.5); (1 + w) RMSNorms incl. pre/post feedforward norms;
           embeddings times sqrt(64);
           hidden_activation gelu_pytorch_tanh.
  gemma3   Gemma3ForCausalLM (model_type gemma3_text); tied; head_dim 32; layer_types [sliding_attention,
           full_attention] (sliding_window_pattern 2); sliding_window 6; rope_local_base_freq 10000 (sliding layers)
           != rope_theta 1e6 (full layers), rope_scaling {rope_type linear, factor 2} on the full layers only;
           query_pre_attn_scalar 24 (!= head_dim 32); q_norm/k_norm ((1 + w) RMSNorm per head); no softcapping
           (Gemma3Attention never passes attn_logit_softcapping on). Window, rope_scaling and rope_local_base_freq
           ablation-checked.
  phi3     Phi3ForCausalLM; fused self_attn.qkv_proj ([q; k; v] rows) and mlp.gate_up_proj ([gate; up] rows); untied;
           rope_scaling {type longrope, short_factor, long_factor} with original_max_position_embeddings 64 and
           max_position_embeddings 128: every position here (< 40) uses short_factor, and cos/sin are multiplied by
           sqrt(1 + ln(128/64) / ln(64)) = 1.0801; partial_rotary_factor 1.0; rms_norm_eps 1e-5; longrope
           ablation-checked.
  qwen3_moe Qwen3MoeForCausalLM; qwen3's attention (head_dim 16 here) with every MLP an MoE block: 5 experts of
           moe_intermediate_size 16, top-2 (num_experts_per_tok) of the softmax, renormalised (norm_topk_prob true,
           ablation-checked); no shared expert; decoder_sparse_step 1, mlp_only_layers [] (llama.cpp's qwen3moe has
           no dense layers, so a dense layer would leave the GGUF out); tied. Stored one tensor per expert as the
           published checkpoints are (mlp.experts.{e}.gate_proj.weight; transformers 5 keeps them stacked in
           memory and save_pretrained writes them back that way, see checkpoint_state).
  mixtral  MixtralForCausalLM; llama attention, sliding_window null; 4 experts (w1 gate, w3 up, w2 down) of
           intermediate_size 16, top-2 renormalised (num_experts_per_tok ablation-checked: 1); untied. The
           converter writes it as GGUF architecture "llama" with expert_count, merged ffn_*_exps tensors.
"""
import argparse
import json
import math
import pathlib
import shutil
import sys
import tempfile

import safetensors
import safetensors.torch
import torch
import transformers

T = 24          # prompt length, > every sliding window (6)
N_GREEDY = 16   # greedy continuation length
MIN_MARGIN = 2e-2  # smallest allowed top-1 minus top-2 logit at a greedy step
MIN_DISTINCT = 6   # fewest distinct ids in the greedy continuation (a repeated id tests little)
SEED_TRIES = 200  # seeds tried per family before giving up
MIN_ROUTING_MARGIN = 1e-3  # smallest allowed gap between the k-th and (k+1)-th expert's routing probability
BITE = 1e-1     # a softcap must move some logit by more than this to count as exercised
LOGIT_RTOL = 1e-5  # --check: reloaded logits vs the stored ones (same library, same machine: near bit-exact)

COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

# Per family: the config.json fields beyond COMMON; `gemma_norm`: norms store w and apply (1 + w).
FAMILIES = {
    "llama": {
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64},
        },
        "ablations": {"rope_scaling": None},
    },
    "mistral": {
        "config": {
            "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
            "tie_word_embeddings": False, "rope_theta": 1000000.0, "sliding_window": 4096,
        },
    },
    "qwen2": {
        "config": {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
            "tie_word_embeddings": True, "rope_theta": 1000000.0, "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": 2,
        },
    },
    "qwen3": {
        "config": {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
            "head_dim": 32, "intermediate_size": 32,
            "tie_word_embeddings": True, "attention_bias": False, "rope_theta": 1000000.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
        },
    },
    "gemma2": {
        "gemma_norm": True,
        "config": {
            "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh",
            "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True, "attention_bias": False,
            "rope_theta": 10000.0, "sliding_window": 6, "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
        },
        "ablations": {"attn_logit_softcapping": None, "final_logit_softcapping": None, "sliding_window": 4096},
    },
    "gemma3": {
        "gemma_norm": True,
        "config": {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "head_dim": 32, "intermediate_size": 16,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "attention_bias": False,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "sliding_window": 6, "sliding_window_pattern": 2,
            "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": None, "final_logit_softcapping": None,
        },
        "ablations": {"sliding_window": 4096, "rope_scaling": None, "rope_local_base_freq": 1000000.0},
    },
    "phi3": {
        "config": {
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "sliding_window": None,
            "rope_scaling": {"type": "longrope",
                             "short_factor": [1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0],
                             "long_factor": [1.0, 1.2, 1.6, 2.4, 4.0, 6.0, 8.0, 10.0]},
        },
        "ablations": {"rope_scaling": None},
    },
    "qwen3_moe": {
        "experts": True,
        "config": {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
            "intermediate_size": 32, "moe_intermediate_size": 16, "num_experts": 5, "num_experts_per_tok": 2,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "tie_word_embeddings": True, "attention_bias": False, "rope_theta": 1000000.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
            "router_aux_loss_coef": 0.0, "output_router_logits": False,
        },
        "ablations": {"norm_topk_prob": False},
    },
    "mixtral": {
        "experts": True,
        "config": {
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
            "intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
            "tie_word_embeddings": False, "rope_theta": 1000000.0, "sliding_window": None,
            "router_aux_loss_coef": 0.0, "output_router_logits": False,
        },
        "ablations": {"num_experts_per_tok": 1},
    },
}


def family_config(family: str) -> dict:
    return {**COMMON, **FAMILIES[family]["config"]}


def redraw_weights(model: torch.nn.Module, gemma_norm: bool, seed: int) -> None:
    """Replaces every parameter with a seeded normal draw rounded to bf16 (kept as f32 in the model)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1 and "norm" in name:
                # Norm weights: (1 + w) with w ~ N(0, 0.2) for gemma, w ~ N(1, 0.2) elsewhere. Gemma's final norm
                # is drawn around 2 (scale 3): its small tied embeddings (below) would otherwise give logits too
                # small for final_logit_softcapping to matter.
                centre = (2.0 if name == "model.norm.weight" else 0.0) if gemma_norm else 1.0
                value = centre + 0.2 * torch.randn(p.shape, generator=gen)
            elif p.dim() == 1:  # biases
                value = 0.3 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name:
                # Small against the blocks' outputs: tied, a large embedding makes the last token's own logit win
                # and greedy repeats it forever. Gemma multiplies embeddings by sqrt(hidden) = 8.
                value = (0.05 if gemma_norm else 0.4) * torch.randn(p.shape, generator=gen)
            elif "lm_head" in name:
                value = 3.0 / math.sqrt(p.shape[1]) * torch.randn(p.shape, generator=gen)
            else:  # matrices, and stacked expert matrices [experts, rows, cols]: scaled by their fan-in
                value = 1.5 / math.sqrt(p.shape[-1]) * torch.randn(p.shape, generator=gen)
            p.copy_(value.to(torch.bfloat16).to(torch.float32))


def checkpoint_state(model) -> dict:
    """The state dict under the published checkpoints' names, in bf16.

    transformers 5 keeps MoE experts stacked in memory (mlp.experts.gate_up_proj [experts, 2 hidden, dim]);
    save_pretrained writes them back one tensor per expert as the published checkpoints have them
    (mlp.experts.{e}.gate_proj.weight, block_sparse_moe.experts.{e}.w1.weight, ...), and omits a tied lm_head.
    """
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        state = safetensors.torch.load_file(pathlib.Path(tmp) / "model.safetensors")
    return {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(state.items())}


def routing_margin(model, tokens: torch.Tensor) -> float | None:
    """Smallest gap between the k-th and (k+1)-th routing probability over every token and MoE layer (None for
    dense models): a token whose experts are a near tie could be routed differently by a correct implementation."""
    k = getattr(model.config, "num_experts_per_tok", None)
    if k is None:
        return None
    with torch.no_grad():
        router_logits = model(tokens[None, :], use_cache=False, output_router_logits=True).router_logits
    margin = math.inf
    for layer_logits in router_logits:
        p = torch.softmax(layer_logits.float(), dim=-1).sort(dim=-1, descending=True).values
        margin = min(margin, float((p[:, k - 1] - p[:, k]).min()))
    return margin


def fixed_tokens(vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(3, vocab, (T,), generator=gen)  # ids 0-2 are pad/bos/eos


def load_reference(directory: pathlib.Path, **config_overrides):
    config = transformers.AutoConfig.from_pretrained(directory, **config_overrides)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, config=config, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{directory}: loading reported {problems}")
    return model.eval()


def forward_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens[None, :], use_cache=False).logits[0].float()


def greedy(model, tokens: torch.Tensor) -> torch.Tensor:
    generation = transformers.GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0,
                                               eos_token_id=None, pad_token_id=0, bos_token_id=None)
    with torch.no_grad():
        out = model.generate(tokens[None, :], generation_config=generation,
                             attention_mask=torch.ones(1, T, dtype=torch.long))
    return out[0, T:]


class NearTie(Exception):
    """A seed whose greedy continuation is fragile (near tie), uninformative (one id repeated) or stops (eos)."""


def verify(family: str, directory: pathlib.Path, logits: torch.Tensor, cont: torch.Tensor, tokens: torch.Tensor,
           model, ablations: bool = True) -> list[str]:
    """Checks that the fixture is non-degenerate and that its greedy tokens are robust; returns notes for the log."""
    notes = []
    eos = model.config.eos_token_id
    if eos in cont.tolist():  # generate stops there (it keeps the config's eos), as lowbit's generator would
        raise NearTie(f"{family}: greedy {cont.tolist()} emits the eos id {eos}")
    if cont.numel() != N_GREEDY:
        sys.exit(f"{family}: generate gave {cont.numel()} tokens, not {N_GREEDY}")
    # Greedy must be the argmax of one uncached forward over prompt + continuation (cache and no cache agree),
    # and every step must have a clear winner.
    full = forward_logits(model, torch.cat([tokens, cont]))
    steps = full[T - 1:T - 1 + N_GREEDY]
    if not torch.equal(steps.argmax(-1), cont):
        sys.exit(f"{family}: cached greedy {cont.tolist()} != uncached argmax {steps.argmax(-1).tolist()}")
    if len(set(cont.tolist())) < MIN_DISTINCT:
        raise NearTie(f"{family}: greedy {cont.tolist()} has fewer than {MIN_DISTINCT} distinct ids")
    top2 = steps.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    if margin < MIN_MARGIN:
        raise NearTie(f"{family}: a greedy step is a near tie (margin {margin:.3g} < {MIN_MARGIN})")
    # Also check that logits of the prompt forward equal those of the longer forward (causality).
    if not torch.allclose(full[:T], logits, rtol=1e-5, atol=1e-5):
        sys.exit(f"{family}: the prompt's logits change when more tokens follow")
    spread = float(logits.std())
    if spread < 0.3:
        sys.exit(f"{family}: logits std {spread:.3g} is degenerate")
    notes.append(f"logits std {spread:.3f}, min greedy margin {margin:.3f}")
    routing = routing_margin(model, torch.cat([tokens, cont]))
    if routing is not None:
        if routing < MIN_ROUTING_MARGIN:
            raise NearTie(f"{family}: a token's experts are a near tie (routing margin {routing:.3g})")
        notes.append(f"min routing margin {routing:.4f}")
    # Each feature named in `ablations` must matter: the same weights with that config.json field changed give
    # logits that differ by more than BITE.
    for field, value in (FAMILIES[family].get("ablations", {}) if ablations else {}).items():
        with tempfile.TemporaryDirectory() as tmp:
            ablated = pathlib.Path(tmp)
            (ablated / "config.json").write_text(json.dumps({**family_config(family), field: value}))
            (ablated / "model.safetensors").symlink_to((directory / "model.safetensors").resolve())
            other = forward_logits(load_reference(ablated), tokens)
        moved = float((other - logits).abs().max())
        if moved <= BITE:
            sys.exit(f"{family}: {field} does not matter (logits move by {moved:.3g} with {field}={value})")
        notes.append(f"{field}={value} moves logits by {moved:.3f} (max |logit| {float(other.abs().max()):.2f})")
    return notes


def write_family(family: str, out: pathlib.Path, first_seed: int) -> None:
    """Tries seeds first_seed, first_seed + 1, ... until the greedy continuation has no near tie."""
    for seed in range(first_seed, first_seed + SEED_TRIES):
        try:
            return write_family_with_seed(family, out, seed)
        except NearTie as e:
            print(f"{e}; seed {seed} rejected")
    sys.exit(f"{family}: no seed in [{first_seed}, {first_seed + SEED_TRIES}) avoids near ties")


def write_family_with_seed(family: str, out: pathlib.Path, seed: int) -> None:
    spec = FAMILIES[family]
    directory = out / family
    directory.mkdir(parents=True, exist_ok=True)
    config_json = family_config(family)
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")

    config = transformers.AutoConfig.from_pretrained(directory)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    redraw_weights(model, spec.get("gemma_norm", False), seed)
    if spec.get("experts"):
        state = checkpoint_state(model)
    else:
        state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
        if config_json["tie_word_embeddings"]:
            del state["lm_head.weight"]  # stored once, as in the published tied checkpoints
    safetensors.torch.save_file(state, directory / "model.safetensors", metadata={"format": "pt"})

    reference = load_reference(directory)
    tokens = fixed_tokens(config_json["vocab_size"])
    logits = forward_logits(reference, tokens)
    cont = greedy(reference, tokens)
    notes = verify(family, directory, logits, cont, tokens, reference)
    write_gguf_expectation(family, directory)
    safetensors.torch.save_file(
        {"tokens": tokens.to(torch.int32), "logits": logits.contiguous(), "greedy": cont.to(torch.int32)},
        directory / "expected.safetensors", metadata=versions())
    sizes = {p.name: p.stat().st_size for p in sorted(directory.iterdir())}
    print(f"{family}: seed {seed}, {', '.join(notes)}; greedy {cont.tolist()}; sizes {sizes} "
          f"(total {sum(sizes.values())} B)")


def versions() -> dict:
    """One metadata entry (safetensors writes a map's keys in no fixed order; one key keeps the bytes reproducible)."""
    return {"generated_by": json.dumps({"script": "scripts/make_family_fixtures.py", "torch": torch.__version__,
                                        "transformers": transformers.__version__,
                                        "safetensors": safetensors.__version__, "python": sys.version.split()[0]})}


# Families converted to GGUF with --llama-cpp: the new ones, plus llama for the converter's q/k row permutation.
GGUF_FAMILIES = ("llama", "gemma2", "gemma3", "phi3", "qwen3_moe", "mixtral")


def llama_cpp_gguf_view(family: str) -> dict:
    """The config.json changes that make HF compute what llama.cpp computes from the converter's GGUF.

    The converter writes neither query_pre_attn_scalar nor the gemma3 layer pattern: llama.cpp scales by
    1/sqrt(head_dim) (gemma2.cpp, gemma3.cpp; 1/sqrt(hidden/heads) only for the 27B sizes) and takes gemma3's
    pattern as 6 (layer i slides iff i % 6 < 5), so both layers of the 2-layer fixture slide.
    """
    config = family_config(family)
    if family == "gemma2":
        return {"query_pre_attn_scalar": config["head_dim"]}
    if family == "gemma3":
        return {"query_pre_attn_scalar": config["head_dim"],
                "layer_types": ["sliding_attention" if i % 6 < 5 else "full_attention"
                                for i in range(config["num_hidden_layers"])]}
    return {}


def write_gguf_expectation(family: str, directory: pathlib.Path) -> None:
    """expected_gguf.safetensors: the HF logits of the model as llama.cpp reads the converter's GGUF of it.

    Written only where that differs from config.json (llama_cpp_gguf_view); raises NearTie like verify, so the seed
    search also keeps these greedy steps clear.
    """
    view = llama_cpp_gguf_view(family)
    if not view:
        return
    config_json = family_config(family)
    with tempfile.TemporaryDirectory() as tmp:
        viewed = pathlib.Path(tmp)
        (viewed / "config.json").write_text(json.dumps({**config_json, **view}))
        (viewed / "model.safetensors").symlink_to((directory / "model.safetensors").resolve())
        model = load_reference(viewed)
        tokens = fixed_tokens(config_json["vocab_size"])
        logits = forward_logits(model, tokens)
        cont = greedy(model, tokens)
        notes = verify(family, viewed, logits, cont, tokens, model, ablations=False)
    safetensors.torch.save_file({"tokens": tokens.to(torch.int32), "logits": logits.contiguous(),
                                 "greedy": cont.to(torch.int32)},
                                directory / "expected_gguf.safetensors",
                                metadata={**versions(), "llama_cpp_view": json.dumps(view)})
    print(f"{family}: llama.cpp view {view}: {', '.join(notes)}; greedy {cont.tolist()}")


def write_gguf(family: str, out: pathlib.Path, llama_cpp: pathlib.Path) -> None:
    """Converts out/<family> to out/<family>/model.gguf with llama.cpp's own convert_hf_to_gguf classes (bf16).

    The converter needs a tokenizer; these fixtures have none, so set_vocab is replaced by a stub vocabulary of
    `vocab_size` pieces "<i>" (tokenizer model "llama", scores 0, normal types, bos/eos from config.json), and gemma3's
    embedding-row truncation reads the vocabulary size from a stub tokenizer.json of the same size (no truncation).
    Everything else (tensor names, norm +1, q/k permutation, fused tensors, rope factors, metadata) is the
    converter's. Where llama.cpp reads the GGUF differently from HF's config (see llama_cpp_gguf_view), the HF
    logits of that view are in expected_gguf.safetensors (write_gguf_expectation, written with the HF fixture).
    """
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import gguf  # noqa: E402  (llama.cpp's own gguf-py, matching its converter)
    from conversion import ModelBase, get_model_class  # noqa: E402

    directory = out / family
    config_json = family_config(family)
    vocab = config_json["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        hf = pathlib.Path(tmp) / f"{family}-fixture"  # the converter names the model after its directory
        hf.mkdir()
        shutil.copy(directory / "config.json", hf / "config.json")
        shutil.copy(directory / "model.safetensors", hf / "model.safetensors")
        (hf / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"<{i}>": i for i in range(vocab)}},
                                                       "added_tokens": []}))
        hparams = ModelBase.load_hparams(hf, False)
        converter_class = get_model_class(hparams["architectures"][0])
        converter = converter_class(hf, gguf.LlamaFileType.MOSTLY_BF16, directory / "model.gguf", eager=True)

        def stub_vocab(self) -> None:
            self.gguf_writer.add_tokenizer_model("llama")
            self.gguf_writer.add_tokenizer_pre("default")
            self.gguf_writer.add_token_list([f"<{i}>".encode() for i in range(vocab)])
            self.gguf_writer.add_token_scores([0.0] * vocab)
            self.gguf_writer.add_token_types([gguf.TokenType.NORMAL] * vocab)
            self.gguf_writer.add_bos_token_id(config_json["bos_token_id"])
            self.gguf_writer.add_eos_token_id(config_json["eos_token_id"])

        converter.set_vocab = stub_vocab.__get__(converter)
        converter.write()
    describe_gguf(family, directory)


def describe_gguf(family: str, directory: pathlib.Path) -> None:
    """Prints how each GGUF tensor relates to the HF tensor it came from (the converter's transformations)."""
    import gguf  # noqa: E402
    reader = gguf.GGUFReader(directory / "model.gguf")
    hf = safetensors.torch.load_file(directory / "model.safetensors")
    config = family_config(family)
    relations = {}
    for t in reader.tensors:
        data = torch.from_numpy(t.data.copy())
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            data = data.view(torch.int16).view(torch.bfloat16)
        data = data.float().reshape(tuple(reversed([int(n) for n in t.shape])))
        found = "no HF source"
        for name, source in hf.items():
            source = source.float()
            if source.shape != data.shape:
                continue
            if torch.equal(source, data):
                found = f"{name} as is"
            elif torch.equal(source + 1, data):
                found = f"{name} + 1"
            elif source.dim() == 2 and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
                permuted = (source.reshape(heads, 2, source.shape[0] // heads // 2, -1).swapaxes(1, 2)
                            .reshape(source.shape))
                if torch.equal(permuted, data):
                    found = f"{name} rows permuted (reshape(heads, 2, hd/2).swapaxes(1, 2))"
            if found != "no HF source":
                break
        relations[t.name] = (t.tensor_type.name, found)
    blk0 = {k: v for k, v in relations.items() if not k.startswith("blk.") or k.startswith("blk.0.")}
    keys = [f.name for f in reader.fields.values() if not f.name.startswith("tokenizer.ggml.token")]
    size = (directory / "model.gguf").stat().st_size
    print(f"{family}: model.gguf {size} B; tensors (blk.0 shown): {blk0}; keys: {keys}")


# Families also written as mlx-lm 4-bit checkpoints with --mlx (mlx-lm stacks the experts: switch_mlp).
MLX_FAMILIES = ("qwen3_moe", "mixtral")
MLX_GROUP = 32  # group size; widths that are no multiple of it (the experts' down_proj here) stay unquantized


def write_mlx(family: str, out: pathlib.Path, mlx_out: pathlib.Path) -> None:
    """Converts out/<family> with mlx-lm (4-bit affine, group MLX_GROUP) into mlx_out/<family>/ and stores mlx-lm's
    own float32 logits over the same tokens and its greedy continuation (uncached argmax steps) beside it.

    mlx-lm's `convert` also wants a tokenizer, which the fixtures lack, so its pieces are called directly:
    load_model, quantize_model, save_model, save_config (config.json with the "quantization" block).
    """
    import mlx.core as mx  # noqa: E402
    import mlx_lm  # noqa: E402
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model  # noqa: E402
    import numpy as np  # noqa: E402

    directory = mlx_out / family
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    model, config = load_model(out / family)
    model, config = quantize_model(model, config, MLX_GROUP, 4)
    save_model(directory, model, donate_model=False)
    save_config(config, directory / "config.json")
    (directory / "model.safetensors.index.json").unlink(missing_ok=True)
    model, _ = load_model(directory)
    model.set_dtype(mx.float32)  # compute in f32 from the stored bf16 scales and weights (as lowbit does)
    tokens = fixed_tokens(config["vocab_size"])

    def logits_of(ids: list[int]) -> np.ndarray:
        return np.array(model(mx.array([ids])).astype(mx.float32))[0]

    logits = logits_of(tokens.tolist())
    ids = tokens.tolist()
    for _ in range(N_GREEDY):
        ids.append(int(logits_of(ids)[-1].argmax()))
    cont = torch.tensor(ids[T:], dtype=torch.int32)
    step_logits = logits_of(ids)[T - 1:T - 1 + N_GREEDY]
    top2 = np.sort(step_logits, axis=-1)[:, -2:]
    margin = float((top2[:, 1] - top2[:, 0]).min())
    safetensors.torch.save_file(
        {"tokens": tokens.to(torch.int32), "logits": torch.from_numpy(logits.copy()).contiguous(), "greedy": cont},
        directory / "expected.safetensors",
        metadata={"generated_by": json.dumps({"script": "scripts/make_family_fixtures.py --mlx",
                                              "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
                                              "source": f"tests/model/fixtures/families/{family}"})})
    sizes = {p.name: p.stat().st_size for p in sorted(directory.iterdir())}
    print(f"{family} (mlx): greedy {cont.tolist()}, min greedy margin {margin:.3f}; sizes {sizes}")


def check_family(family: str, out: pathlib.Path) -> None:
    directory = out / family
    check_expected(family, directory, directory / "expected.safetensors")
    if (directory / "expected_gguf.safetensors").exists():
        with tempfile.TemporaryDirectory() as tmp:
            viewed = pathlib.Path(tmp)
            (viewed / "config.json").write_text(json.dumps({**family_config(family), **llama_cpp_gguf_view(family)}))
            (viewed / "model.safetensors").symlink_to((directory / "model.safetensors").resolve())
            check_expected(family, viewed, directory / "expected_gguf.safetensors")


def check_expected(family: str, directory: pathlib.Path, expected_path: pathlib.Path) -> None:
    expected = safetensors.torch.load_file(expected_path)
    reference = load_reference(directory)
    tokens = expected["tokens"].long()
    logits = forward_logits(reference, tokens)
    rel = float((logits - expected["logits"]).abs().max() / expected["logits"].abs().max())
    cont = greedy(reference, tokens)
    same_greedy = torch.equal(cont, expected["greedy"].long())
    ok = rel <= LOGIT_RTOL and same_greedy
    print(f"{family} {expected_path.name}: max |d logit| / max |logit| {rel:.3g}, "
          f"greedy {'equal' if same_greedy else 'DIFFERENT'}"
          f" -> {'ok' if ok else 'FAIL'}")
    if not ok:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = pathlib.Path(__file__).resolve().parent.parent
    parser.add_argument("--out", type=pathlib.Path, default=root / "tests/model/fixtures/families")
    parser.add_argument("--check", action="store_true", help="reload each fixture and re-verify; write nothing")
    parser.add_argument("--llama-cpp", type=pathlib.Path,
                        help="llama.cpp source tree (e.g. vendor/llama.cpp of the llama-cpp-python sdist): also "
                             f"write model.gguf for {', '.join(GGUF_FAMILIES)} with its converter")
    parser.add_argument("--mlx", type=pathlib.Path, nargs="?", const=root / "tests/model/fixtures/mlx",
                        help=f"also write mlx-lm 4-bit checkpoints of {', '.join(MLX_FAMILIES)} with mlx-lm's "
                             "logits into this folder (default tests/model/fixtures/mlx)")
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the reduction order does not depend on the machine's core count
    for family in args.families:
        if args.check:
            check_family(family, args.out)
        else:
            write_family(family, args.out, first_seed=1000 * (1 + list(FAMILIES).index(family)))
            if args.llama_cpp and family in GGUF_FAMILIES:
                write_gguf(family, args.out, args.llama_cpp.resolve())
        if args.mlx and family in MLX_FAMILIES:
            write_mlx(family, args.out, args.mlx)


if __name__ == "__main__":
    main()

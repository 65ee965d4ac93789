#!/usr/bin/python3
"""An independent reference for tessera's models: the forward pass of
transformers' GPT2LMHeadModel and LlamaForCausalLM written from their
published definitions in PyTorch (float64), reading a Hugging Face model
directory (config.json plus model.safetensors or the sharded index) with its
own safetensors parser. Shares no code with tessera.

  hf_reference.py eval MODEL_DIR TEXT_FILE SEQ WINDOWS
prints `eval_loss X`: the mean next-token cross-entropy over the first
WINDOWS consecutive windows of SEQ+1 bytes of TEXT_FILE (byte tokens), as
train_gpt --eval-text computes it.

  hf_reference.py make MODEL_DIR SEED DTYPE KEY=VALUE...
writes a model directory (config.json from the KEY=VALUE pairs, integers,
floats, true/false or JSON objects; model.safetensors with random weights of
std 0.2 around 0, norm gains around 1, in DTYPE F32 or BF16), weights far
from any initialisation so that every term of the forward pass shows in the
loss. Exit 77 when torch is missing.
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # the caller skips the test
    print(f"skip: {e}", file=sys.stderr)
    sys.exit(77)


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        shape = e["shape"]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise SystemExit(f"{path}: dtype {e['dtype']} of {name} is not a float")
        out[name] = torch.from_numpy(a.reshape(shape).copy())
    return out


def read_model(d):
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(d, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for name in files:
            tensors.update(read_safetensors(os.path.join(d, name)))
    else:
        tensors = read_safetensors(os.path.join(d, "model.safetensors"))
    return config, tensors


def causal_attention(q, k, v):
    # q: [B, H, T, d], k, v: [B, H, T, d]
    t = q.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def gpt2_logits(c, w, x):
    b, t = x.shape
    e, hn = c["n_embd"], c["n_head"]
    eps = c.get("layer_norm_epsilon", 1e-5)
    ln = lambda h, p: torch.nn.functional.layer_norm(h, (e,), w[p + ".weight"], w[p + ".bias"], eps)
    pre = "transformer." if "transformer.wte.weight" in w else ""
    h = w[pre + "wte.weight"][x] + w[pre + "wpe.weight"][torch.arange(t)]
    for i in range(c["n_layer"]):
        p = f"{pre}h.{i}."
        a = ln(h, p + "ln_1")
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: [in, out]
        q, k, v = qkv.split(e, dim=-1)
        heads = lambda z: z.view(b, t, hn, e // hn).transpose(1, 2)
        y = causal_attention(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(b, t, e)
        h = h + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = ln(h, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m**3)))  # gelu_new
        h = h + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    h = ln(h, pre + "ln_f")
    return h @ w[pre + "wte.weight"].T


def llama_inv_freq(c, d):
    theta = c.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        lo_wavelen, hi_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def llama_logits(c, w, x):
    b, t = x.shape
    e, hn = c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads", hn)
    d = c.get("head_dim") or e // hn
    eps = c.get("rms_norm_eps", 1e-6)

    def rms(h, name):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w[name]

    def lin(h, name):
        y = h @ w[name + ".weight"].T  # nn.Linear: [out, in]
        return y + w[name + ".bias"] if name + ".bias" in w else y

    inv = llama_inv_freq(c, d)
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rope(z):  # [B, H, T, d], rotate-half layout
        z1, z2 = z[..., : d // 2], z[..., d // 2 :]
        return z * cos + torch.cat([-z2, z1], dim=-1) * sin

    h = w["model.embed_tokens.weight"][x]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(h, p + "input_layernorm.weight")
        q = lin(a, p + "self_attn.q_proj").view(b, t, hn, d).transpose(1, 2)
        k = lin(a, p + "self_attn.k_proj").view(b, t, kv, d).transpose(1, 2)
        v = lin(a, p + "self_attn.v_proj").view(b, t, kv, d).transpose(1, 2)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(hn // kv, dim=1)  # repeat_kv: query head j reads KV head j // (hn / kv)
        v = v.repeat_interleave(hn // kv, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, hn * d)
        h = h + lin(y, p + "self_attn.o_proj")
        m = rms(h, p + "post_attention_layernorm.weight")
        gate, up = lin(m, p + "mlp.gate_proj"), lin(m, p + "mlp.up_proj")
        h = h + lin(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    h = rms(h, "model.norm.weight")
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return h @ head.T


def tensor_shapes(c):
    """Hugging Face names and shapes of the model config.json `c` describes."""
    if c["model_type"] == "gpt2":
        e, v, t, f = c["n_embd"], c["vocab_size"], c["n_positions"], c.get("n_inner") or 4 * c["n_embd"]
        out = {"transformer.wte.weight": [v, e], "transformer.wpe.weight": [t, e]}
        for i in range(c["n_layer"]):
            p = f"transformer.h.{i}."
            out.update({p + "ln_1.weight": [e], p + "ln_1.bias": [e], p + "attn.c_attn.weight": [e, 3 * e],
                        p + "attn.c_attn.bias": [3 * e], p + "attn.c_proj.weight": [e, e], p + "attn.c_proj.bias": [e],
                        p + "ln_2.weight": [e], p + "ln_2.bias": [e], p + "mlp.c_fc.weight": [e, f],
                        p + "mlp.c_fc.bias": [f], p + "mlp.c_proj.weight": [f, e], p + "mlp.c_proj.bias": [e]})
        out.update({"transformer.ln_f.weight": [e], "transformer.ln_f.bias": [e]})
        return out
    e, hn, v, f = c["hidden_size"], c["num_attention_heads"], c["vocab_size"], c["intermediate_size"]
    kv = c.get("num_key_value_heads", hn)
    d = c.get("head_dim") or e // hn
    out = {"model.embed_tokens.weight": [v, e]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": [e], p + "self_attn.q_proj.weight": [hn * d, e],
                    p + "self_attn.k_proj.weight": [kv * d, e], p + "self_attn.v_proj.weight": [kv * d, e],
                    p + "self_attn.o_proj.weight": [e, hn * d], p + "post_attention_layernorm.weight": [e],
                    p + "mlp.gate_proj.weight": [f, e], p + "mlp.up_proj.weight": [f, e],
                    p + "mlp.down_proj.weight": [e, f]})
        if c.get("attention_bias"):
            out.update({p + "self_attn.q_proj.bias": [hn * d], p + "self_attn.k_proj.bias": [kv * d],
                        p + "self_attn.v_proj.bias": [kv * d], p + "self_attn.o_proj.bias": [e]})
    out["model.norm.weight"] = [e]
    if not c.get("tie_word_embeddings", False):
        out["lm_head.weight"] = [v, e]
    return out


def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        if dtype == "BF16":  # round to nearest even, as torch does
            u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
        else:
            raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make(model, seed, dtype, pairs):
    c = {}
    for kv in pairs:
        k, v = kv.split("=", 1)
        c[k] = json.loads(v) if v[:1] in "{[" or v in ("true", "false", "null") else (float(v) if "." in v or "e" in v else (int(v) if v.lstrip("-").isdigit() else v))
    c.setdefault("architectures", ["GPT2LMHeadModel" if c["model_type"] == "gpt2" else "LlamaForCausalLM"])
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in tensor_shapes(c).items():
        a = rng.normal(0.0, 0.2, size=shape)
        if name.endswith("norm.weight") or (".ln_" in name and name.endswith(".weight")):
            a += 1.0
        tensors[name] = a
    os.makedirs(model, exist_ok=True)
    write_safetensors(os.path.join(model, "model.safetensors"), tensors, dtype)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:])
        return
    if len(sys.argv) != 6 or sys.argv[1] != "eval":
        raise SystemExit(__doc__)
    model, text, seq, windows = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    config, w = read_model(model)
    with open(text, "rb") as f:
        data = f.read()
    n = min(len(data) // (seq + 1), windows)
    x = torch.tensor(list(data[: n * (seq + 1)]), dtype=torch.long).view(n, seq + 1)
    kind = config["model_type"]
    logits = (gpt2_logits if kind == "gpt2" else llama_logits)(config, w, x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    print(f"eval_loss {loss.item():.9f}")


if __name__ == "__main__":
    main()

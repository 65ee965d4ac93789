#!/usr/bin/python3
"""A plain PyTorch greedy decode loop with a KV cache on one thread: the
baseline of scripts/bench_decode.sh. The model is built from a Hugging Face
config.json (GPT-2 or Llama: the shapes only; the weights are random, which
does not change the work per token). Prints decode tokens/s (the mean over
steps after the prefill) as `torch decode tokens/s: X`.
Usage: torch_decode.py CONFIG_JSON PROMPT_TOKENS NEW_TOKENS"""
import json
import math
import sys
import time

import torch

torch.set_num_threads(1)
cfg = json.load(open(sys.argv[1]))
prompt_len, new = int(sys.argv[2]), int(sys.argv[3])
llama = cfg["model_type"] == "llama"
if llama:
    H, L, nh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kvh, F, V, ctx = cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]
else:
    H, L, nh = cfg["n_embd"], cfg["n_layer"], cfg["n_head"]
    kvh, F, V, ctx = nh, 4 * cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
hd = H // nh
g = torch.Generator().manual_seed(0)
def w(*s):
    return torch.randn(*s, generator=g) * 0.02

emb = w(V, H)
pos = w(ctx, H)
layers = []
for _ in range(L):
    if llama:
        layers.append(dict(q=w(nh * hd, H), k=w(kvh * hd, H), v=w(kvh * hd, H), o=w(H, H),
                           gate=w(F, H), up=w(F, H), down=w(H, F), n1=torch.ones(H), n2=torch.ones(H)))
    else:
        layers.append(dict(qkv=w(3 * H, H), qkvb=torch.zeros(3 * H), o=w(H, H), ob=torch.zeros(H),
                           fc=w(F, H), fcb=torch.zeros(F), proj=w(H, F), projb=torch.zeros(H),
                           n1=torch.ones(H), b1=torch.zeros(H), n2=torch.ones(H), b2=torch.zeros(H)))
head = emb if not llama else w(V, H)
nf, nfb = torch.ones(H), torch.zeros(H)
inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2).float() / hd))
ang = torch.outer(torch.arange(ctx).float(), inv)
cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
K = [torch.zeros(kvh, ctx, hd) for _ in range(L)]
Vc = [torch.zeros(kvh, ctx, hd) for _ in range(L)]

def rms(x, gain):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gain

def rope(x, p0, n):  # x [heads, n, hd]
    c, s = cos[p0:p0 + n], sin[p0:p0 + n]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * c + torch.cat([-x2, x1], -1) * s

def forward(tokens, p0):
    n = len(tokens)
    x = emb[tokens] if llama else emb[tokens] + pos[p0:p0 + n]
    mask = torch.full((n, p0 + n), float("-inf")).triu(p0 + 1)
    for i, l in enumerate(layers):
        if llama:
            h = rms(x, l["n1"])
            q = (h @ l["q"].T).view(n, nh, hd).transpose(0, 1)
            k = (h @ l["k"].T).view(n, kvh, hd).transpose(0, 1)
            v = (h @ l["v"].T).view(n, kvh, hd).transpose(0, 1)
            q, k = rope(q, p0, n), rope(k, p0, n)
        else:
            h = torch.nn.functional.layer_norm(x, (H,), l["n1"], l["b1"])
            q, k, v = (h @ l["qkv"].T + l["qkvb"]).split(H, -1)
            q, k, v = (t.view(n, nh, hd).transpose(0, 1) for t in (q, k, v))
        K[i][:, p0:p0 + n] = k
        Vc[i][:, p0:p0 + n] = v
        kk, vv = K[i][:, : p0 + n], Vc[i][:, : p0 + n]
        if kvh != nh:
            kk, vv = kk.repeat_interleave(nh // kvh, 0), vv.repeat_interleave(nh // kvh, 0)
        a = torch.softmax(q @ kk.transpose(1, 2) / math.sqrt(hd) + mask, -1) @ vv
        a = a.transpose(0, 1).reshape(n, H)
        if llama:
            x = x + a @ l["o"].T
            h = rms(x, l["n2"])
            x = x + (torch.nn.functional.silu(h @ l["gate"].T) * (h @ l["up"].T)) @ l["down"].T
        else:
            x = x + a @ l["o"].T + l["ob"]
            h = torch.nn.functional.layer_norm(x, (H,), l["n2"], l["b2"])
            x = x + torch.nn.functional.gelu(h @ l["fc"].T + l["fcb"], approximate="tanh") @ l["proj"].T + l["projb"]
    x = rms(x[-1:], nf) if llama else torch.nn.functional.layer_norm(x[-1:], (H,), nf, nfb)
    return x @ head.T

with torch.inference_mode():
    toks = list(range(1, prompt_len + 1))
    nxt = int(forward(toks, 0).argmax())
    t0 = time.perf_counter()
    for step in range(1, new):
        nxt = int(forward([nxt], prompt_len + step - 1).argmax())
    dt = time.perf_counter() - t0
print(f"torch decode tokens/s: {(new - 1) / dt:.1f}")

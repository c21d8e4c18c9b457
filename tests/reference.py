"""An independent, slow re-implementation of the reference mechanics, for cross-checks only.

It follows the way the original authors' code computes relevance — every rule
as ``X ⊙ autograd.grad(Z, X, safe_divide(R, Z))`` on saved forward tensors,
whole-tensor sums in the normalised Add, one sample at a time, the
``clamp(min=1e-9) + clamp(max=1e-9)`` stabiliser — rather than the engine's
closed forms, so that agreement between the two is a real check of the engine.
It reads the weights of a timm ViT or a Hugging Face BERT; it is not part of
the library.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def safe_divide(a: Tensor, b: Tensor) -> Tensor:
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).type(den.type()) * 1e-9
    return a / den * b.ne(0).type(b.type())


def _grad(Z, X, S):
    return torch.autograd.grad(Z, X, S, retain_graph=True)


def _leaf(t: Tensor) -> Tensor:
    return t.detach().clone().requires_grad_(True)


# --------------------------------------------------------------------------- rules
def linear_rel(X: Tensor, W: Tensor, R: Tensor, shared: bool) -> Tensor:
    """α=1, β=0 on the signed input; shared (ours) or separate (baseline) denominators."""
    X = _leaf(X)
    pw, nw = W.clamp(min=0), W.clamp(max=0)
    px, nx = X.clamp(min=0), X.clamp(max=0)

    def f(w1, w2, x1, x2):
        Z1, Z2 = F.linear(x1, w1), F.linear(x2, w2)
        if shared:
            S1 = S2 = safe_divide(R, Z1 + Z2)
        else:
            S1, S2 = safe_divide(R, Z1), safe_divide(R, Z2)
        C1 = x1 * _grad(Z1, x1, S1)[0]
        C2 = x2 * _grad(Z2, x2, S2)[0]
        return C1 + C2

    return f(pw, nw, px, nx).detach()


def add_rel(u: Tensor, v: Tensor, R: Tensor, normalise: bool):
    u, v = _leaf(u), _leaf(v)
    Z = u + v
    S = safe_divide(R, Z)
    C = _grad(Z, [u, v], S)
    a, b = (u * C[0]).detach(), (v * C[1]).detach()
    if not normalise:
        return a, b
    a_sum, b_sum = a.sum(), b.sum()
    a_fact = safe_divide(a_sum.abs(), a_sum.abs() + b_sum.abs()) * R.sum()
    b_fact = safe_divide(b_sum.abs(), a_sum.abs() + b_sum.abs()) * R.sum()
    return a * safe_divide(a_fact, a.sum()), b * safe_divide(b_fact, b.sum())


def einsum_rel(eq: str, a: Tensor, b: Tensor, R: Tensor):
    a, b = _leaf(a), _leaf(b)
    Z = torch.einsum(eq, a, b)
    S = safe_divide(R, Z)
    C = _grad(Z, [a, b], S)
    return (a * C[0]).detach(), (b * C[1]).detach()


def clone_rel(X: Tensor, Rs: list) -> Tensor:
    X = _leaf(X)
    Z = [X * 1.0 for _ in Rs]
    S = [safe_divide(r, z) for r, z in zip(Rs, Z)]
    C = _grad(Z, X, S)[0]
    return (X * C).detach()


def select_rel(X: Tensor, R: Tensor) -> Tensor:
    """IndexSelect: ``X ⊙ grad(Z, X, safe_divide(R, Z))`` with Z the selected token."""
    X = _leaf(X)
    Z = X * 1.0
    return (X * _grad(Z, X, safe_divide(R, Z))[0]).detach()


def zbox_rel(X: Tensor, W: Tensor, R: Tensor, stride, padding) -> Tensor:
    pw, nw = W.clamp(min=0), W.clamp(max=0)
    L = X * 0 + X.amin(dim=(1, 2, 3), keepdim=True)
    H = X * 0 + X.amax(dim=(1, 2, 3), keepdim=True)
    conv = lambda x, w: F.conv2d(x, w, bias=None, stride=stride, padding=padding)  # noqa: E731
    Za = conv(X, W) - conv(L, pw) - conv(H, nw) + 1e-9
    S = R / Za
    tr = lambda w: F.conv_transpose2d(S, w, stride=stride, padding=padding)  # noqa: E731
    return (X * tr(W) - L * tr(pw) - H * tr(nw)).detach()


def rollout(mats: list, start: int, row_norm: bool) -> Tensor:
    n = mats[0].shape[-1]
    eye = torch.eye(n, dtype=mats[0].dtype).expand(mats[0].shape[0], n, n)
    mats = [m + eye for m in mats]
    if row_norm:
        mats = [m / m.sum(dim=-1, keepdim=True) for m in mats]
    joint = mats[start]
    for i in range(start + 1, len(mats)):
        joint = mats[i].bmm(joint)
    return joint


# --------------------------------------------------------------------------- timm ViT
def vit_forward(model, x: Tensor) -> tuple[Tensor, list, dict]:
    """Forward of a timm ViT (batch 1) in the reference's style; saves what relprop needs."""
    m = model
    saved = {"blocks": []}
    patches = m.patch_embed.proj(x)
    tok_patches = patches.flatten(2).transpose(1, 2)
    tok = torch.cat([m.cls_token.expand(x.shape[0], -1, -1), tok_patches], dim=1)
    h = tok + m.pos_embed
    saved.update(x=x, tok=tok.detach(), pos=m.pos_embed.detach())
    for blk in m.blocks:
        s = {}
        a = blk.attn
        s["x"] = h
        n1 = blk.norm1(h)
        s["n1"] = n1
        b, n, _ = n1.shape
        qkv = a.qkv(n1)
        q, k, v = qkv.reshape(b, n, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
        s.update(q=q, k=k, v=v)
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * a.scale
        attn = dots.softmax(dim=-1)
        attn.retain_grad()
        s["attn"] = attn
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        out = out.transpose(1, 2).reshape(b, n, -1)
        s["o"] = out
        ao = blk.ls1(a.proj(out))
        s["ao"] = ao
        h2 = h + ao
        s["x2"] = h2
        n2 = blk.norm2(h2)
        s["n2"] = n2
        g = blk.mlp.act(blk.mlp.fc1(n2))
        s["g"] = g
        f = blk.ls2(blk.mlp.fc2(g))
        s["f"] = f
        h = h2 + f
        saved["blocks"].append(s)
    hn = m.norm(h)
    cls = hn[:, 0]
    saved["cls"] = cls
    return m.head(cls), saved["blocks"], saved


def vit_relprop(model, saved: dict, blocks: list, one_hot: Tensor, ours: bool, stop: int = 0) -> list:
    """Relevance pass; returns R^{A_b} per block (None below ``stop``) and the block-0 input relevance."""
    m = model
    R = linear_rel(saved["cls"], m.head.weight, one_hot, shared=ours)
    N = blocks[0]["x"].shape[1]
    Rt = torch.zeros(1, N, R.shape[-1], dtype=R.dtype)
    Rt[:, 0] = select_rel(saved["cls"], R)
    R = Rt
    cams = [None] * len(blocks)
    for i in range(len(blocks) - 1, stop - 1, -1):
        blk, s = m.blocks[i], blocks[i]
        a = blk.attn
        r1, r2 = add_rel(s["x2"], s["f"], R, normalise=ours)
        r2 = linear_rel(s["g"], blk.mlp.fc2.weight, r2, shared=ours)
        r2 = linear_rel(s["n2"], blk.mlp.fc1.weight, r2, shared=ours)
        R = clone_rel(s["x2"], [r1, r2])
        r1, r2 = add_rel(s["x"], s["ao"], R, normalise=ours)
        r2 = linear_rel(s["o"], a.proj.weight, r2, shared=ours)
        b, n, _ = r2.shape
        r2 = r2.reshape(b, n, a.num_heads, a.head_dim).transpose(1, 2)
        cam1, cam_v = einsum_rel("bhij,bhjd->bhid", s["attn"], s["v"], r2)
        cam1, cam_v = cam1 / 2, cam_v / 2
        cams[i] = cam1
        if i == stop and not saved.get("to_pixels"):
            R = None
            break
        cam_q, cam_k = einsum_rel("bhid,bhjd->bhij", s["q"], s["k"], cam1)
        cam_q, cam_k = cam_q / 2, cam_k / 2
        cam_qkv = torch.stack([cam_q, cam_k, cam_v], 0).permute(1, 3, 0, 2, 4).reshape(b, n, -1)
        r2 = linear_rel(s["n1"], a.qkv.weight, cam_qkv, shared=ours)
        R = clone_rel(s["x"], [r1, r2])
    return cams, R


def vit_transformer_attribution(model, x: Tensor, target: int | None = None, start_layer: int = 0) -> Tensor:
    out = []
    for i in range(x.shape[0]):
        logits, blocks, saved = vit_forward(model, x[i : i + 1])
        t = int(logits.argmax()) if target is None else target
        one_hot = torch.zeros_like(logits)
        one_hot[0, t] = 1
        (one_hot * logits).sum().backward(retain_graph=True)
        cams, _ = vit_relprop(model, saved, blocks, one_hot.detach(), ours=True, stop=start_layer)
        mats = []
        for b, s in enumerate(blocks):
            if cams[b] is None:
                mats.append(torch.zeros(1, s["attn"].shape[-1], s["attn"].shape[-1], dtype=s["attn"].dtype))
                continue
            cam = (s["attn"].grad * cams[b]).clamp(min=0).mean(dim=1)
            mats.append(cam)
        out.append(rollout(mats, start_layer, row_norm=False)[:, 0, 1:])
    return torch.cat(out)


def vit_lrp(model, x: Tensor, target: int | None = None) -> tuple[Tensor, Tensor]:
    """Full baseline LRP to the pixels (B, H, W), and partial LRP (B, P)."""
    pixels, partial = [], []
    for i in range(x.shape[0]):
        with torch.enable_grad():
            logits, blocks, saved = vit_forward(model, x[i : i + 1])
        t = int(logits.argmax()) if target is None else target
        one_hot = torch.zeros_like(logits)
        one_hot[0, t] = 1
        saved["to_pixels"] = True
        cams, R = vit_relprop(model, saved, blocks, one_hot, ours=False, stop=0)
        partial.append(cams[-1].clamp(min=0).mean(dim=1)[:, 0, 1:])
        r_tok, _ = add_rel(saved["tok"], saved["pos"].expand_as(saved["tok"]), R, normalise=False)
        r = r_tok[:, 1:]
        conv = model.patch_embed.proj
        gh, gw = x.shape[-2] // conv.stride[0], x.shape[-1] // conv.stride[1]
        r = r.transpose(1, 2).reshape(1, -1, gh, gw)
        px = zbox_rel(saved["x"], conv.weight, r, conv.stride, conv.padding)
        pixels.append(px.sum(dim=1))
    return torch.cat(pixels), torch.cat(partial)


# --------------------------------------------------------------------------- HF BERT
def bert_transformer_attribution(model, input_ids: Tensor, target: int | None = None, start_layer: int = 0) -> Tensor:
    """Batch-1 BERT transformer attribution in the reference's style (no padding)."""
    base = model.base_model
    x = base.embeddings(input_ids=input_ids)
    blocks = []
    h = x
    for layer in base.encoder.layer:
        sa, so = layer.attention.self, layer.attention.output
        s = {"h": h}
        b, n, _ = h.shape
        H, d = sa.num_attention_heads, sa.attention_head_size
        q = sa.query(h).view(b, n, H, d).transpose(1, 2)
        k = sa.key(h).view(b, n, H, d).transpose(1, 2)
        v = sa.value(h).view(b, n, H, d).transpose(1, 2)
        s.update(q=q, k=k, v=v)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (d**0.5)
        mask = torch.zeros(1, 1, 1, n)
        s["scores"], s["mask"] = scores, mask
        probs = (scores + mask).softmax(dim=-1)
        probs.retain_grad()
        s["attn"] = probs
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, n, H * d)
        s["ctx"] = ctx
        d1 = so.dense(ctx)
        s["d1"] = d1
        a = so.LayerNorm(d1 + h)
        s["a"] = a
        g = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(a))
        s["g"] = g
        d2 = layer.output.dense(g)
        s["d2"] = d2
        h = layer.output.LayerNorm(d2 + a)
        blocks.append(s)
    cls = h[:, 0]
    pooled = base.pooler.activation(base.pooler.dense(cls))
    logits = model.classifier(pooled)
    t = int(logits.argmax()) if target is None else target
    one_hot = torch.zeros_like(logits)
    one_hot[0, t] = 1
    (one_hot * logits).sum().backward(retain_graph=True)

    R = linear_rel(pooled, model.classifier.weight, one_hot, shared=True)
    R = linear_rel(cls, base.pooler.dense.weight, R, shared=True)
    n = input_ids.shape[1]
    Rt = torch.zeros(1, n, R.shape[-1], dtype=R.dtype)
    Rt[:, 0] = select_rel(cls, R)
    R = Rt
    cams = [None] * len(blocks)
    for i in range(len(blocks) - 1, start_layer - 1, -1):
        layer, s = base.encoder.layer[i], blocks[i]
        sa, so = layer.attention.self, layer.attention.output
        r_branch, r_skip = add_rel(s["d2"], s["a"], R, normalise=True)
        r_branch = linear_rel(s["g"], layer.output.dense.weight, r_branch, shared=True)
        r_branch = linear_rel(s["a"], layer.intermediate.dense.weight, r_branch, shared=True)
        R = clone_rel(s["a"], [r_branch, r_skip])
        r_branch, r_skip = add_rel(s["d1"], s["h"], R, normalise=True)
        r_branch = linear_rel(s["ctx"], so.dense.weight, r_branch, shared=True)
        b, nn_, _ = r_branch.shape
        H, d = sa.num_attention_heads, sa.attention_head_size
        r_branch = r_branch.view(b, nn_, H, d).transpose(1, 2)
        cam1, cam_v = einsum_rel("bhij,bhjd->bhid", s["attn"], s["v"], r_branch)
        cam1, cam_v = cam1 / 2, cam_v / 2
        cams[i] = cam1
        if i == start_layer:
            break
        cam1, _ = add_rel(s["scores"], s["mask"].expand_as(s["scores"]), cam1, normalise=True)
        cq, ckT = einsum_rel("bhid,bhdj->bhij", s["q"], s["k"].transpose(-1, -2), cam1)
        cq, ck = cq / 2, ckT.transpose(-1, -2) / 2
        flat = lambda t: t.transpose(1, 2).reshape(b, nn_, H * d)  # noqa: E731, B023 - used in this iteration only
        rq = linear_rel(s["h"], sa.query.weight, flat(cq), shared=True)
        rk = linear_rel(s["h"], sa.key.weight, flat(ck), shared=True)
        rv = linear_rel(s["h"], sa.value.weight, flat(cam_v), shared=True)
        r_attn = clone_rel(s["h"], [rq, rk, rv])
        R = clone_rel(s["h"], [r_attn, r_skip])
    mats = []
    for b_, s in enumerate(blocks):
        if cams[b_] is None:
            mats.append(torch.zeros(1, n, n))
        else:
            mats.append((s["attn"].grad * cams[b_]).clamp(min=0).mean(dim=1))
    joint = rollout(mats, start_layer, row_norm=True)
    joint[:, 0, 0] = joint[:, 0].min()
    return joint[:, 0]

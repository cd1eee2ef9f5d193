"""Golden MARS and MARS-M trajectories on the torch view of a Llama layer and a Mixtral MoE block.

A copy of the shared generators (golden_mars.py, golden_mars_m.py) with `SHAPES` replaced by the "torch view" of
two Levanter modules, each stacked over 2 layers: the names and shapes `haliax.state_dict.to_torch_compatible_state_dict`
gives them (one 2-D `nn.Linear` weight per layer, and per expert for Mixtral, as in HF Mixtral). The official code runs
on those tensors exactly as it would inside a PyTorch model: MARS routes by `ndim == 2`; MARS-M gets every 2-D tensor
as a Muon parameter and every 1-D one as AdamW (no embedding or head in these blocks).

Usage (CPU venv with torch and numpy; GIT_DIR a checkout or bare mirror of AGI-Arena/MARS, read at run time):
    python generate.py OUT_DIR --mirror GIT_DIR [--seed 0] [--steps 8]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

LAYERS = 2


def _per_layer(shapes):
    return {f"{i}.{name}": shape for i in range(LAYERS) for name, shape in shapes.items()}


# LlamaConfig(hidden_dim=8, intermediate_dim=24, num_heads=4, num_kv_heads=2): head_size 2, q (4 heads x 2) x 8.
LLAMA_LAYER = _per_layer({
    "self_attn.q_proj.weight": (8, 8),
    "self_attn.k_proj.weight": (4, 8),
    "self_attn.v_proj.weight": (4, 8),
    "self_attn.o_proj.weight": (8, 8),
    "mlp.gate_proj.weight": (24, 8),
    "mlp.up_proj.weight": (24, 8),
    "mlp.down_proj.weight": (8, 24),
    "input_layernorm.weight": (8,),
    "post_attention_layernorm.weight": (8,),
})
# MixtralConfig(hidden_dim=8, intermediate_dim=12, n_routed_experts=4): the router gate and each expert's w1/w2/w3.
MIXTRAL_MOE = _per_layer({
    "gate.weight": (4, 8),
    **{f"experts.{e}.{w}.weight": ((8, 12) if w == "w2" else (12, 8)) for e in range(4) for w in ("w1", "w2", "w3")},
})
BLOCKS = {"llama_layer": LLAMA_LAYER, "mixtral_moe": MIXTRAL_MOE}


def load(mirror, path, cls):
    src = subprocess.check_output(["git", "-C", mirror, "show", f"HEAD:{path}"]).decode()
    src = src.replace("@torch.compile", "")
    d = tempfile.mkdtemp()
    mod = os.path.splitext(os.path.basename(path))[0] + "_ref"
    with open(os.path.join(d, mod + ".py"), "w") as f:
        f.write(src)
    sys.path.insert(0, d)
    return getattr(__import__(mod), cls)


def make_case(rng, shapes, steps):
    init = {k: rng.standard_normal(s).astype(np.float32) * 0.5 for k, s in shapes.items()}
    a = {k: rng.uniform(0.2, 2.0, (steps, *s)).astype(np.float32) for k, s in shapes.items()}
    t = {k: rng.standard_normal((steps, *s)).astype(np.float32) for k, s in shapes.items()}
    return init, a, t


def run(make_optimizer, shapes, init, a, t, steps):
    names = list(shapes)
    params = {k: torch.nn.Parameter(torch.tensor(init[k].copy())) for k in names}
    opt = make_optimizer(params)
    traj = {k: [] for k in names}
    for i in range(steps):
        for k in names:
            params[k].grad = torch.tensor(a[k][i]) * (params[k].detach() - torch.tensor(t[k][i]))
        opt.step()
        for k in names:
            traj[k].append(params[k].detach().numpy().copy())
    return {k: np.stack(v) for k, v in traj.items()}


MARS_HP = dict(lr=3e-2, betas=(0.95, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-adamw",
               optimize_1d=False, lr_1d=1.5e-2, betas_1d=(0.9, 0.95), weight_decay_1d=0.1)
MARS_M_HP = dict(lr=2e-2, wd=1e-2, momentum=0.95, ns_steps=5, adamw_betas=(0.9, 0.95), adamw_eps=1e-8, gamma=0.025)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--mirror", required=True, help="git dir of AGI-Arena/MARS")
    args = ap.parse_args()
    MARS = load(args.mirror, "MARS/optimizers/mars.py", "MARS")
    MARS_M = load(args.mirror, "MARS_M/optimizers/mars_m.py", "MARS_M")
    os.makedirs(args.out, exist_ok=True)
    for block, shapes in BLOCKS.items():
        matrices = [k for k, s in shapes.items() if len(s) == 2]
        optimizers = {
            "mars_adamw": (MARS_HP, "MARS/optimizers/mars.py",
                           lambda p: MARS(list(p.values()), is_approx=True, **MARS_HP)),
            "mars_m": (MARS_M_HP, "MARS_M/optimizers/mars_m.py",
                       lambda p: MARS_M(muon_params=[p[k] for k in matrices],
                                        adamw_params=[p[k] for k in p if k not in matrices], **MARS_M_HP)),
        }
        for optimizer, (hp, reference, make) in optimizers.items():
            rng = np.random.default_rng(args.seed)
            init, a, t = make_case(rng, shapes, args.steps)
            traj = run(make, shapes, init, a, t, args.steps)
            meta = dict(case=f"{block}_{optimizer}", block=block, reference=reference, exact=False, steps=args.steps,
                        names=list(shapes), shapes={k: list(v) for k, v in shapes.items()},
                        roles={k: ("matrix" if k in matrices else "adamw") for k in shapes},
                        hp={k: (list(v) if isinstance(v, tuple) else v) for k, v in hp.items()}, eps=1e-8)
            arrays = {"meta": np.array(json.dumps(meta))}
            for k in shapes:
                arrays[f"init/{k}"], arrays[f"a/{k}"], arrays[f"t/{k}"], arrays[f"traj/{k}"] = init[k], a[k], t[k], traj[k]
            path = os.path.join(args.out, f"{block}_{optimizer}.npz")
            np.savez_compressed(path, **arrays)
            print(path, round(max(float(np.abs(traj[k][-1] - init[k]).max()) for k in shapes), 4))


if __name__ == "__main__":
    main()

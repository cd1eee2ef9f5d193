"""Golden MARS trajectories from the official PyTorch implementation: the generator of every case in this directory.

Runs the reference optimizer (AGI-Arena/MARS, MARS/optimizers/mars.py, read from
a git mirror at run time, never committed) on a small problem and writes
an .npz per case, so that the project's JAX optimizer can be held to it.
The shared generator (golden_mars.py) with the amsgrad cases added; on the earlier
cases it reproduces the inputs exactly and the trajectories to float32 rounding
(README.md).

Usage (CPU venv with torch and numpy):
    python generate.py OUT_DIR --mirror GIT_DIR [--seed S] [--steps N] [--tag T] [--only CASE ...]
where GIT_DIR is a git checkout or bare mirror of AGI-Arena/MARS.

Problem: per-tensor quadratic f(x; xi) = sum 0.5 * a_xi * (x - t_xi)^2 with
a new batch xi every step. Gradients are analytic, so 'exact' mode (gradient at
the previous parameters on the current batch) is reproducible in any framework.

Each npz holds:
  init/<name>           initial parameters
  a/<name>, t/<name>    per-step batch arrays, shape (steps, *param_shape)
  traj/<name>           parameters after every step, shape (steps, *param_shape)
  meta                  json string: hyperparameters, mode, names, shapes
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

def load_reference(mirror):
    src = subprocess.check_output(["git", "-C", mirror, "show", "HEAD:MARS/optimizers/mars.py"]).decode()
    # torch.compile on CPU is irrelevant for a reference; keep the plain function.
    src = src.replace("@torch.compile", "")
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "ref_mars.py"), "w") as f:
        f.write(src)
    sys.path.insert(0, d)
    import ref_mars  # noqa: E402

    return ref_mars.MARS


SHAPES = {
    "w_tall": (24, 16),
    "w_wide": (12, 40),
    "w_square": (16, 16),
    "bias": (16,),
    "scale": (40,),
}


def make_case(rng, steps, a_scale=1.0):
    init = {k: rng.standard_normal(s).astype(np.float32) * 0.5 for k, s in SHAPES.items()}
    a = {k: (rng.uniform(0.2, 2.0, (steps, *s)) * a_scale).astype(np.float32) for k, s in SHAPES.items()}
    t = {k: rng.standard_normal((steps, *s)).astype(np.float32) for k, s in SHAPES.items()}
    return init, a, t


def run(MARS, init, a, t, steps, hp, exact):
    names = list(SHAPES)
    params = [torch.nn.Parameter(torch.tensor(init[k].copy())) for k in names]
    opt = MARS(params, is_approx=not exact, **hp)

    def grad_at(xs, i):
        return [torch.tensor(a[k][i]) * (x.detach() - torch.tensor(t[k][i])) for k, x in zip(names, xs)]

    traj = {k: [] for k in names}
    for i in range(steps):
        if exact:
            # official 'exact' scheme: gradient at the current params on the NEXT batch,
            # stored before the step and used as last_grad at the next step.
            if i + 1 < steps:
                for p, g in zip(params, grad_at(params, i + 1)):
                    p.grad = g
                opt.update_previous_grad()
        for p, g in zip(params, grad_at(params, i)):
            p.grad = g
        opt.step()
        if exact:
            opt.update_last_grad()
        for k, p in zip(names, params):
            traj[k].append(p.detach().numpy().copy())
    return {k: np.stack(v) for k, v in traj.items()}


CASES = {
    # name: (hyperparameters, exact[, a_scale])
    "adamw_approx": (dict(lr=3e-2, betas=(0.95, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-adamw",
                          optimize_1d=False, lr_1d=1.5e-2, betas_1d=(0.9, 0.95), weight_decay_1d=0.1), False),
    "adamw_approx_opt1d": (dict(lr=3e-2, betas=(0.95, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-adamw",
                                optimize_1d=True), False),
    "adamw_exact": (dict(lr=3e-2, betas=(0.95, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-adamw",
                         optimize_1d=False, lr_1d=1.5e-2, betas_1d=(0.9, 0.95), weight_decay_1d=0.1), True),
    "lion_approx": (dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-lion",
                         optimize_1d=False, lr_1d=3e-3, betas_1d=(0.9, 0.95), weight_decay_1d=0.1), False),
    "shampoo_approx": (dict(lr=3e-2, betas=(0.95, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-shampoo",
                            optimize_1d=False, lr_1d=1.5e-2, betas_1d=(0.9, 0.95), weight_decay_1d=0.1), False),
    "adamw_gamma_big": (dict(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, gamma=0.5, mars_type="mars-adamw",
                             optimize_1d=False, lr_1d=1e-2, betas_1d=(0.9, 0.95), weight_decay_1d=0.0), False),
    # gradients small enough that the per-tensor clip of c_t never fires
    "adamw_noclip": (dict(lr=1e-2, betas=(0.95, 0.99), weight_decay=1e-2, gamma=0.025, mars_type="mars-adamw",
                          optimize_1d=False, lr_1d=5e-3, betas_1d=(0.9, 0.95), weight_decay_1d=0.1), False, 0.002),
}
# amsgrad (a running max of the second moment in the denominator): in MARS-AdamW's matrices, in the 1-D AdamW
# branch, and in MARS-Shampoo's vectors (the 1-D branch, or the MARS-AdamW form with optimize_1d).
AMSGRAD_OF = {
    "adamw_approx_amsgrad": "adamw_approx",
    "adamw_exact_amsgrad": "adamw_exact",
    "adamw_approx_opt1d_amsgrad": "adamw_approx_opt1d",
    "lion_approx_amsgrad": "lion_approx",
    "shampoo_approx_amsgrad": "shampoo_approx",
}
for _case, _base in AMSGRAD_OF.items():
    CASES[_case] = (dict(CASES[_base][0], amsgrad=True), *CASES[_base][1:])
CASES["shampoo_opt1d_amsgrad"] = (dict(CASES["shampoo_approx"][0], optimize_1d=True, amsgrad=True), False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--tag", default="")
    ap.add_argument("--mirror", required=True, help="git dir of AGI-Arena/MARS")
    ap.add_argument("--only", nargs="*", default=None, help="cases to write (default: all)")
    args = ap.parse_args()
    MARS = load_reference(args.mirror)
    os.makedirs(args.out, exist_ok=True)
    for case, (hp, exact, *rest) in CASES.items():
        if args.only is not None and case not in args.only:
            continue
        rng = np.random.default_rng(args.seed)
        init, a, t = make_case(rng, args.steps, *rest)
        traj = run(MARS, init, a, t, args.steps, hp, exact)
        meta = dict(case=case, exact=exact, steps=args.steps, names=list(SHAPES),
                    shapes={k: list(v) for k, v in SHAPES.items()},
                    hp={k: (list(v) if isinstance(v, tuple) else v) for k, v in hp.items() if k != "amsgrad"},
                    eps=1e-8, amsgrad=hp.get("amsgrad", False))
        arrays = {"meta": np.array(json.dumps(meta))}
        for k in SHAPES:
            arrays[f"init/{k}"] = init[k]
            arrays[f"a/{k}"] = a[k]
            arrays[f"t/{k}"] = t[k]
            arrays[f"traj/{k}"] = traj[k]
        path = os.path.join(args.out, f"{case}{args.tag}.npz")
        np.savez_compressed(path, **arrays)
        final = {k: float(np.abs(traj[k][-1] - init[k]).max()) for k in SHAPES}
        print(path, json.dumps(final))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""tools/make_optim_golden.py — writes tests/golden/optim.safetensors: PyTorch's parameters after
each step of SGD, Adam and AdamW on a fixed sequence of gradients, the learning rates of the
schedules step by step, and clip_grad_norm_'s results, for tests/optim/ to compare against.

Run with the system Python, which has PyTorch:  /usr/bin/python3 tools/make_optim_golden.py
Everything is float64 and seeded, so a given PyTorch writes the same bytes every time.

Keys (all F64):
  initial.<i>               the three parameters before the first step: [3, 4], [5], [2]
  grad.<k>.<i>              the gradient of parameter i at step k (k = 0..4); absent when the
                            parameter has no gradient at that step (parameter 2 has gradients
                            at steps 2 and 3 only, so its optimizer state starts late)
  <case>.<k>.<i>            parameter i after step k, for the optimizer cases below
  schedule.<name>           [30] the lr used by optimizer steps 1..30 (lr before each step; the
                            scheduler is stepped after each optimizer step), base lr 0.1
  clip.grad.<i>             the gradients given to clip_grad_norm_ (shapes as the parameters)
  clip.<case>.grad.<i>      the gradients after clip_grad_norm_
  clip.<case>.total         [] the total norm it returned
The metadata holds each case's settings as "<case>.settings" (a Python repr, for people).
"""
import math
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import base_metadata, save_file  # noqa: E402  (the small safetensors writer)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "optim.safetensors")

SHAPES = [(3, 4), (5,), (2,)]
STEPS = 5
GRAD_SCALES = [1.0, 3.0, 0.2, 0.5, 0.1]  # varied, so that amsgrad's running max matters
HAS_GRAD = {2: {2, 3}}                   # parameter -> the steps at which it has a gradient

OPTIMIZERS = {
    "sgd_plain": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1,
                                           weight_decay=0.01)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True,
                                           weight_decay=0.02)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6,
                                            weight_decay=0.1, amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=0.03, betas=(0.85, 0.95), amsgrad=True)),
}


def has_grad(i, k):
    return k in HAS_GRAD.get(i, set(range(STEPS)))


def optimizer_cases(out, meta):
    initial = [torch.randn(*s, dtype=torch.float64) for s in SHAPES]
    grads = {}
    for k in range(STEPS):
        for i, s in enumerate(SHAPES):
            if has_grad(i, k):
                grads[(k, i)] = torch.randn(*s, dtype=torch.float64) * GRAD_SCALES[k]
    for i, p in enumerate(initial):
        out[f"initial.{i}"] = p
    for (k, i), g in grads.items():
        out[f"grad.{k}.{i}"] = g

    for case, (cls, settings) in OPTIMIZERS.items():
        params = [p.clone().requires_grad_() for p in initial]
        opt = cls(params, foreach=False, **settings)  # the single-tensor implementation
        for k in range(STEPS):
            for i, p in enumerate(params):
                p.grad = grads[(k, i)].clone() if (k, i) in grads else None
            opt.step()
            for i, p in enumerate(params):
                out[f"{case}.{k}.{i}"] = p.detach().clone()
        meta[f"{case}.settings"] = f"{cls.__name__}({settings})"


def schedule_lrs(make, steps=30, base_lr=0.1):
    """The lr each of `steps` optimizer steps uses, the scheduler stepped after each."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    scheduler = make(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return torch.tensor(lrs, dtype=torch.float64)


def schedule_cases(out, meta):
    S = torch.optim.lr_scheduler
    cases = {
        "step": ("StepLR(step_size=7, gamma=0.5)", lambda o: S.StepLR(o, 7, gamma=0.5)),
        "multistep": ("MultiStepLR(milestones=[5, 12, 12, 20], gamma=0.3)",
                      lambda o: S.MultiStepLR(o, [5, 12, 12, 20], gamma=0.3)),
        "cosine": ("CosineAnnealingLR(T_max=12, eta_min=0.001)",
                   lambda o: S.CosineAnnealingLR(o, T_max=12, eta_min=0.001)),
        "warmup": ("LinearLR(start_factor=0.1, total_iters=5)",
                   lambda o: S.LinearLR(o, start_factor=0.1, total_iters=5)),
        "warmup_cosine": (
            "SequentialLR([LinearLR(start_factor=0.25, total_iters=4), "
            "CosineAnnealingLR(T_max=26, eta_min=0)], milestones=[4])",
            lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.25, total_iters=4),
                                         S.CosineAnnealingLR(o, T_max=26)], milestones=[4])),
        "onecycle": ("OneCycleLR(max_lr=0.5, total_steps=30)",
                     lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=30,
                                            cycle_momentum=False)),
        "onecycle_three": (
            "OneCycleLR(max_lr=0.4, total_steps=30, pct_start=0.25, anneal_strategy='linear', "
            "div_factor=10, final_div_factor=100, three_phase=True)",
            lambda o: S.OneCycleLR(o, max_lr=0.4, total_steps=30, pct_start=0.25,
                                   anneal_strategy="linear", div_factor=10,
                                   final_div_factor=100, three_phase=True,
                                   cycle_momentum=False)),
    }
    for name, (settings, make) in cases.items():
        out[f"schedule.{name}"] = schedule_lrs(make)
        meta[f"schedule.{name}.settings"] = settings

    # OneCycleLR with its default momentum cycling (0.95 -> 0.85 -> 0.95) on SGD with momentum,
    # and on Adam (where it cycles beta1): the lr and momentum of each step.
    for name, make_opt, key in (
            ("onecycle_momentum.sgd",
             lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "momentum"),
            ("onecycle_momentum.adam", lambda p: torch.optim.Adam(p, lr=0.1), "betas")):
        opt = make_opt([torch.zeros(1, requires_grad=True)])
        scheduler = S.OneCycleLR(opt, max_lr=0.5, total_steps=30, pct_start=0.3)
        lrs, momenta = [], []
        for _ in range(30):
            group = opt.param_groups[0]
            lrs.append(group["lr"])
            momenta.append(group[key][0] if key == "betas" else group[key])
            opt.step()
            scheduler.step()
        out[f"schedule.{name}.lr"] = torch.tensor(lrs, dtype=torch.float64)
        out[f"schedule.{name}.momentum"] = torch.tensor(momenta, dtype=torch.float64)
        meta[f"schedule.{name}.settings"] = "OneCycleLR(max_lr=0.5, total_steps=30), cycling"


def clip_cases(out, meta):
    grads = [torch.randn(*s, dtype=torch.float64) for s in SHAPES]
    for i, g in enumerate(grads):
        out[f"clip.grad.{i}"] = g
    cases = {"l2": (1.0, 2.0), "l2_unclipped": (100.0, 2.0), "inf": (0.5, math.inf),
             "l3": (2.0, 3.0), "l1": (1.5, 1.0)}
    for case, (max_norm, norm_type) in cases.items():
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
        for i, p in enumerate(params):
            out[f"clip.{case}.grad.{i}"] = p.grad
        out[f"clip.{case}.total"] = total.to(torch.float64)
        meta[f"clip.{case}.settings"] = f"max_norm={max_norm}, norm_type={norm_type}"


def main():
    # SequentialLR steps its second scheduler with step(0) and PyTorch warns about that itself
    warnings.filterwarnings("ignore", message="The epoch parameter")
    torch.manual_seed(11)
    out, meta = {}, base_metadata("optimizers, lr schedules and clip_grad_norm_ (optim/)")
    meta["generator"] = "tools/make_optim_golden.py"
    optimizer_cases(out, meta)
    schedule_cases(out, meta)
    clip_cases(out, meta)
    save_file(OUT, out, meta)


if __name__ == "__main__":
    main()

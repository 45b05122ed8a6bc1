"""A minimal single-file PPO for CartPole-v1, without any framework: the floor that flowrl's PPO time is compared with.

Plain torch and gymnasium in one process: 8 CartPoles in gymnasium's numpy-vectorised env, one batched
forward pass per step, then six epochs of minibatch Adam. The numerics are those of flowrl's PPO main job
(``flowrl.cli.MAIN_JOB`` with :mod:`flowrl.algorithms.ppo`), so "flowrl's PPO time to 450 no longer than a
minimal single-file PPO" compares the same computation:

- 8 envs, 500 steps each per round: train batch 4000, minibatch 128 (the last one of an epoch 32 rows),
  6 epochs with a fresh permutation each, Adam lr 3e-4, no gradient clipping;
- separate policy and value MLPs 64-64 tanh (torch's default init; heads orthogonal, gain 0.01 and 1.0);
- GAE with gamma 0.99 and lambda 1.0 (``PPOConfig.lambda_``): a terminated step has no future value, a
  truncated one and the round's last step bootstrap from ``V`` of the true final observation;
- advantages standardized over the batch, ``(x - mean) / max(1e-4, std)``;
- loss ``-min(A r, A clip(r, 0.7, 1.3)) + vf_loss + kl_coeff KL(old || new)`` with the value loss clipped
  at 10 (RLlib's, after PPO2); entropy coefficient 0;
- ``kl_coeff`` starts at 0.2 and is x1.5 / x0.5 when the mean KL of the last epoch's minibatches is above
  2 x / below 0.5 x the target 0.01.

The envs reset in the step that ends an episode, as flowrl's ``VectorEnv`` does (gymnasium's vectorised
CartPole resets at the start of the next step, which would count a no-op step per episode). Start-up
(imports, envs, model) is timed apart; the return is the mean of the last 100 episodes, checked after each
round as flowrl reports it.

Run: ``python benchmarks/minimal_ppo.py [--quick] [--seed 0] [--max-steps 300000] [--stop-return 450]``
(``--quick``: stop at return 150 or 60k steps). The last line is ``minimal_ppo_env_steps_per_s=<value>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

THRESHOLDS = (150.0, 450.0)
# -- hyperparameters: flowrl's PPO main job ------------------------------------------------------------
NUM_ENVS, STEPS_PER_ENV = 8, 500  # train batch 4000 = 2 workers x 4 envs x fragment 500 in flowrl
MINIBATCH, EPOCHS, LR = 128, 6, 3e-4
GAMMA, LAMBDA = 0.99, 1.0
CLIP, VF_CLIP, VF_COEFF = 0.3, 10.0, 1.0
KL_COEFF, KL_TARGET = 0.2, 0.01


class CartPoles:
    """gymnasium's numpy-vectorised CartPole whose finished envs reset in the same step.

    ``step`` returns ``(obs, final_obs, rewards, terminateds, truncateds)``: ``obs`` is what to act on next
    and ``final_obs`` each transition's true next observation (they differ where an episode ended).
    """

    def __init__(self, num_envs: int, seed: int) -> None:
        self.vec: Any = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
        self.obs, _ = self.vec.reset(seed=seed)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        final_obs, rewards, terminateds, truncateds, _ = self.vec.step(actions)
        done = terminateds | truncateds
        obs = final_obs.copy()
        if done.any():  # what the env would do at the start of the next step, done now: same draws, same order
            env = self.vec
            env.state[:, done] = env.np_random.uniform(low=env.low, high=env.high, size=(4, int(done.sum())))
            env.steps[done], env.prev_done[:] = 0, False
            obs[done] = env.state[:, done].T
        self.obs = obs
        return obs, final_obs, rewards, terminateds, truncateds


class ActorCritic(nn.Module):
    """Policy and value MLPs, built in the order flowrl's ``ActorCriticModel`` builds them."""

    def __init__(self, obs_size: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()

        def trunk() -> nn.Sequential:
            return nn.Sequential(nn.Linear(obs_size, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())

        def head(size: int, gain: float) -> nn.Linear:
            layer = nn.Linear(hidden, size)
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
            return layer

        self.pi_trunk, self.vf_trunk = trunk(), trunk()
        self.pi_head, self.vf_head = head(num_actions, 0.01), head(1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pi_head(self.pi_trunk(obs)), self.vf_head(self.vf_trunk(obs)).squeeze(-1)


# -- ALGO LOGIC ---------------------------------------------------------------------------------------------
def gae(rewards_TN: np.ndarray, values_TN: np.ndarray, next_values_TN: np.ndarray, terminateds_TN: np.ndarray,
        truncateds_TN: np.ndarray, gamma: float, lambda_: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE(gamma, lambda) over T time-ordered steps of N envs; a column may span several episodes.

    ``next_values_TN`` is ``V`` of each transition's true next observation, read where it did not terminate;
    the recursion restarts after every terminated or truncated step. Returns float32 ``(advantages,
    value_targets)``, ``value_targets = advantages + values``.
    """
    deltas = rewards_TN + gamma * np.where(terminateds_TN, 0.0, next_values_TN.astype(np.float64)) - values_TN
    keep = ~(terminateds_TN | truncateds_TN)
    adv_TN, running = np.zeros(deltas.shape), np.zeros(deltas.shape[1:])
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + gamma * lambda_ * keep[t] * running
        adv_TN[t] = running
    return adv_TN.astype(np.float32), (adv_TN + values_TN).astype(np.float32)


def ppo_loss(model: ActorCritic, mb: dict[str, torch.Tensor], kl_coeff: float) -> tuple[torch.Tensor, float]:
    """flowrl's ``PPOPolicy.loss`` (entropy coefficient 0); returns the loss and the minibatch's mean KL."""
    logits, values = model(mb["obs"])
    logp_all = torch.log_softmax(logits, -1)
    ratio = torch.exp(logp_all.gather(1, mb["actions"][:, None]).squeeze(1) - mb["logp"])
    adv = mb["advantages"]
    policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(1.0 - CLIP, 1.0 + CLIP)).mean()
    old_logp_all = torch.log_softmax(mb["logits"], -1)
    kl = (old_logp_all.exp() * (old_logp_all - logp_all)).sum(-1).mean()
    old_values, targets = mb["values"], mb["targets"]
    clipped = old_values + (values - old_values).clamp(-VF_CLIP, VF_CLIP)
    vf_loss = torch.max((values - targets).pow(2), (clipped - targets).pow(2)).mean()
    total = policy_loss + VF_COEFF * vf_loss + (kl_coeff * kl if kl_coeff > 0 else 0.0)
    return total, float(kl.detach())


def adapt_kl_coeff(kl_coeff: float, sampled_kl: float) -> float:
    """x1.5 when the sampled KL is above twice the target, x0.5 below half of it (flowrl's and RLlib's rule)."""
    if sampled_kl > 2.0 * KL_TARGET:
        return kl_coeff * 1.5
    return kl_coeff * 0.5 if sampled_kl < 0.5 * KL_TARGET else kl_coeff


def train(args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    envs = CartPoles(NUM_ENVS, args.seed)
    model = ActorCritic(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    kl_coeff, T, N = KL_COEFF, STEPS_PER_ENV, NUM_ENVS
    returns: deque[float] = deque(maxlen=100)
    ep_return_N = np.zeros(N)
    reached: dict[float, tuple[float, int] | None] = {t: None for t in THRESHOLDS}
    steps, iterations, sample_s, learn_s, mean_return = 0, 0, 0.0, 0.0, float("nan")
    startup_s = time.perf_counter() - start
    train_start = time.perf_counter()
    while steps < args.max_steps and not mean_return >= args.stop_return:
        # (1) sample T steps of N envs with the current policy
        t0 = time.perf_counter()
        obs_TN, final_obs_TN = np.zeros((T, N, 4), np.float32), np.zeros((T, N, 4), np.float32)
        logits_TN, actions_TN = np.zeros((T, N, 2), np.float32), np.zeros((T, N), np.int64)
        logp_TN, values_TN, rewards_TN = (np.zeros((T, N), np.float32) for _ in range(3))
        terminateds_TN, truncateds_TN = np.zeros((T, N), bool), np.zeros((T, N), bool)
        with torch.inference_mode():
            for t in range(T):
                obs_TN[t] = envs.obs
                logits, values = model(torch.from_numpy(envs.obs))
                logp_all = torch.log_softmax(logits, -1)
                actions = torch.multinomial(logp_all.exp(), 1).squeeze(1)
                logits_TN[t], values_TN[t], actions_TN[t] = logits.numpy(), values.numpy(), actions.numpy()
                logp_TN[t] = logp_all.gather(1, actions[:, None]).squeeze(1).numpy()
                _, final_obs_TN[t], rewards_TN[t], terminateds_TN[t], truncateds_TN[t] = envs.step(actions_TN[t])
                ep_return_N += rewards_TN[t]
                for i in np.flatnonzero(terminateds_TN[t] | truncateds_TN[t]):
                    returns.append(float(ep_return_N[i]))
                    ep_return_N[i] = 0.0
            next_values_TN = model(torch.from_numpy(final_obs_TN.reshape(T * N, 4)))[1].numpy().reshape(T, N)
        adv_TN, targets_TN = gae(rewards_TN, values_TN, next_values_TN, terminateds_TN, truncateds_TN, GAMMA, LAMBDA)
        adv = adv_TN.reshape(-1)
        batch = {"obs": obs_TN.reshape(-1, 4), "actions": actions_TN.reshape(-1), "logp": logp_TN.reshape(-1),
                 "logits": logits_TN.reshape(-1, 2), "values": values_TN.reshape(-1),
                 "targets": targets_TN.reshape(-1), "advantages": (adv - adv.mean()) / max(1e-4, float(adv.std()))}
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        steps += T * N
        t1 = time.perf_counter()
        # (2) EPOCHS of minibatch SGD, then adapt the KL coefficient to the last epoch's mean KL
        for _ in range(EPOCHS):
            perm, kls = torch.from_numpy(rng.permutation(T * N)), []
            for lo in range(0, T * N, MINIBATCH):
                idx = perm[lo:lo + MINIBATCH]
                loss, kl = ppo_loss(model, {k: v[idx] for k, v in tensors.items()}, kl_coeff)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]  # torch's backward is untyped
                optimizer.step()
                kls.append(kl)
        kl_coeff = adapt_kl_coeff(kl_coeff, float(np.mean(kls)))
        t2 = time.perf_counter()
        sample_s, learn_s, iterations = sample_s + t1 - t0, learn_s + t2 - t1, iterations + 1
        # (3) report: the mean return of the last 100 episodes
        elapsed = t2 - train_start
        mean_return = float(np.mean(returns)) if returns else float("nan")
        for threshold in THRESHOLDS:
            if reached[threshold] is None and mean_return >= threshold:
                reached[threshold] = (elapsed, steps)
        if not args.quiet:
            print(f"iter {iterations:3d}  {steps:>7} steps  return {mean_return:6.1f}  {elapsed:6.1f} s", flush=True)
    train_s = time.perf_counter() - train_start
    return {"config": {"num_envs": N, "steps_per_env": T, "train_batch_size": T * N, "sgd_minibatch_size": MINIBATCH,
                       "num_sgd_iter": EPOCHS, "lr": LR, "gamma": GAMMA, "lambda": LAMBDA, "clip_param": CLIP,
                       "vf_clip_param": VF_CLIP, "kl_coeff": KL_COEFF, "kl_target": KL_TARGET, "seed": args.seed,
                       "torch_threads": torch.get_num_threads()},
            "startup_s": round(startup_s, 2), "train_s": round(train_s, 2), "iterations": iterations,
            "env_steps_sampled": steps, "env_steps_trained": steps,
            "env_steps_per_s_sampled": round(steps / train_s, 1), "env_steps_per_s_trained": round(steps / train_s, 1),
            "final_return": round(mean_return, 1),
            **{f"seconds_to_{int(t)}": None if hit is None else round(hit[0], 2) for t, hit in reached.items()},
            **{f"steps_to_{int(t)}": None if hit is None else hit[1] for t, hit in reached.items()},
            "profile_s": {"sample": round(sample_s, 2), "learn": round(learn_s, 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=300_000)
    parser.add_argument("--stop-return", type=float, default=450.0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a short run: stop at return 150 or 60k steps")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/minimal_ppo[_quick].json)")
    args = parser.parse_args()
    if args.quick:
        args.max_steps, args.stop_return = min(args.max_steps, 60_000), min(args.stop_return, 150.0)
    torch.set_num_threads(args.torch_threads)
    report = train(args)
    profile = report["profile_s"]
    rows = [("env steps/s", report["env_steps_per_s_sampled"]),
            *[(f"wall s to return {int(t)} (steps)",
               f"{report[f'seconds_to_{int(t)}']} ({report[f'steps_to_{int(t)}']})") for t in THRESHOLDS],
            ("start-up s (apart)", report["startup_s"]), ("training s", report["train_s"]),
            ("env steps", report["env_steps_sampled"]), ("final return", report["final_return"]),
            ("profile s: sample / learn", f"{profile['sample']} / {profile['learn']}")]
    print(f"\n| minimal single-file PPO, CartPole-v1 ({NUM_ENVS} envs, 1 process) | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    default = Path(__file__).resolve().parent / "results" / f"minimal_ppo{'_quick' if args.quick else ''}.json"
    out = Path(args.out) if args.out else default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "minimal_ppo", "quick": args.quick, **report,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version(), "torch": torch.__version__,
                                           "gymnasium": gym.__version__}}, indent=2) + "\n")
    print(f"minimal_ppo_env_steps_per_s={report['env_steps_per_s_sampled']}")


if __name__ == "__main__":
    main()

"""What the camera of ``raysim/ReachCamera`` costs a shard: render and step time per row, one torch thread.

    python benchmarks/camera.py [--rows 64] [--size 32]

- render: ``ReachCamera.render`` of every row (the observation of one step);
- step: ``ReachCamera.step`` against ``Reach.step`` on the same rows and actions (the difference is
  what the camera adds to a step: every row's image, plus the finished rows' final images);
- the float-to-uint8 cast of the image: torch's ``.to(torch.uint8)`` against NumPy's ``astype``.

The median of repeated timings, wall clock and, for the render, the thread's CPU time (what the
render costs on a loaded machine, without the waits for a core); compare with the policy's inference
(~70 us per sample for a small CNN).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from raysim.envs import make


def median_seconds(fn, repeats: int, clock=time.perf_counter) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.rows
    camera = make("raysim/ReachCamera", n, seed=0, camera={"size": args.size})
    plain = make("raysim/Reach", n, seed=0)
    rows = torch.arange(n)
    generator = torch.Generator().manual_seed(0)
    actions = [torch.rand(n, 2, generator=generator) * 2 - 1 for _ in range(64)]
    counter = iter(range(10**9))

    render = median_seconds(lambda: camera.render(rows), args.repeats)
    render_cpu = median_seconds(lambda: camera.render(rows), args.repeats, time.thread_time)
    step_camera = median_seconds(lambda: camera.step(actions[next(counter) % 64]), args.repeats)
    step_plain = median_seconds(lambda: plain.step(actions[next(counter) % 64]), args.repeats)
    image = torch.rand(n, 3, args.size, args.size) * 255
    cast_torch = median_seconds(lambda: image.to(torch.uint8), args.repeats)
    cast_numpy = median_seconds(lambda: torch.from_numpy(image.numpy().astype(np.uint8)), args.repeats)

    def per_row(seconds: float) -> str:
        return f"{seconds * 1e3:.3f} ms ({seconds / n * 1e6:.1f} us/row)"

    print(f"{n} rows, {args.size}x{args.size} RGB, 1 torch thread, medians of {args.repeats}")
    print(f"render every row:        {per_row(render)}; CPU time {per_row(render_cpu)}")
    print(f"ReachCamera.step:        {per_row(step_camera)}")
    print(f"Reach.step:              {per_row(step_plain)}")
    print(f"camera's share of a step: {per_row(step_camera - step_plain)}")
    print(
        f"uint8 cast: torch {cast_torch * 1e6:.1f} us, NumPy {cast_numpy * 1e6:.1f} us ({cast_torch / cast_numpy:.1f}x)"
    )


if __name__ == "__main__":
    main()

"""Search QA retrieval figures: index build time, retrieval latency p50/p99, the expert's EM.

1. The default generated encyclopedia (591 passages): BM25 and dense (the embedded
   all-MiniLM-L6-v2, exact index) build time and latency over the single-hop questions
   (the question text as the query, k = 3), and top-3 recall of the supporting passage.
2. A large generated corpus (``--large``, 100,000 passages) with BM25, and one of
   ``--dense-large`` passages (default also 100,000: embedding them takes about 5 minutes on 2
   threads) with dense retrieval.
3. The expert's exact match per split through the environment (BM25).

    python benchmarks/search_qa_retrieval.py [--large 100000] [--dense-large 100000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from machine import machine_load

from paw_lightning.envs.search_qa import data, generator, index
from paw_lightning.envs.search_qa.env import SearchQAEnv


def corpus_file(folder: str, config: generator.CorpusConfig) -> tuple[str, list[dict]]:
    passages, questions = generator.generate(config)
    path = os.path.join(folder, f"corpus-{config.key()}.jsonl")
    data.write_jsonl(path, passages)
    return path, [q for q in questions if q["type"] == "single_hop"]


def measure(path: str, questions: list[dict], kind: str, cache: str, n_queries: int) -> dict:
    root = index.ensure_corpus(path, cache)
    retriever = index.LocalRetriever(root, kind)
    start = time.perf_counter()
    retriever.prepare()  # builds the index (dense: embeds every passage), then opens it
    prepare_s = time.perf_counter() - start
    build_s = index.read_meta(root)["bm25_build_s" if kind == "bm25" else next(k for k in index.read_meta(root) if k.startswith("dense-"))]
    latencies, hits = [], 0
    for q in questions[:n_queries]:
        t = time.perf_counter()
        found = retriever.retrieve(q["question"], 3)
        latencies.append(1000 * (time.perf_counter() - t))
        hits += q["supporting"][0] in [p.id for p in found]
    latencies.sort()
    return {"passages": index.read_meta(root)["passages"], "build_s": build_s, "prepare_s": prepare_s,
            "p50_ms": statistics.median(latencies), "p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "top3": hits / len(latencies), "queries": len(latencies)}


def show(name: str, kind: str, figures: dict) -> None:
    print(f"{name:>22} {kind:>5}: {figures['passages']:>7} passages, build {figures['build_s']:7.2f} s, "
          f"latency p50 {figures['p50_ms']:.2f} ms / p99 {figures['p99_ms']:.2f} ms over {figures['queries']} queries, "
          f"top-3 recall {figures['top3']:.3f}")


def expert_em(cache: str) -> None:
    for split in ("train", "eval", "ood"):
        env = SearchQAEnv(split=split, cache_dir=cache)
        wins = 0
        for seed in range(env.n_questions):
            env.reset(seed)
            for action in env.walkthrough():
                _, _, done, info = env.step(action)
                if done:
                    break
            wins += info["won"]
        print(f"expert EM {split:>5}: {wins / env.n_questions:.3f} ({wins}/{env.n_questions})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=100_000, help="passages of the large BM25 corpus (0: skip)")
    parser.add_argument("--dense-large", type=int, default=100_000, help="passages of the large dense corpus (0: skip)")
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    print(machine_load())
    with tempfile.TemporaryDirectory() as cache:
        path, questions = corpus_file(cache, generator.CorpusConfig())
        for kind in ("bm25", "dense"):
            show("default", kind, measure(path, questions, kind, cache, args.queries))
        expert_em(cache)
        for kind, n in (("bm25", args.large), ("dense", args.dense_large)):
            if n:
                start = time.perf_counter()
                path, questions = corpus_file(cache, generator.CorpusConfig.with_passages(n))
                print(f"generated ~{n} passages in {time.perf_counter() - start:.1f} s")
                show(f"generated {n}", kind, measure(path, questions, kind, cache, args.queries))
        print(machine_load())


if __name__ == "__main__":
    main()

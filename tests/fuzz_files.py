"""Input files as an attacker would make them (tests/test_cli_schema_fuzz.py): for ``--ckpt_path``,
``--model.init_weights``, ``-c`` and the environments' data paths, a missing file, a directory,
an empty file, random bytes, a real file truncated at random points, and the right format with
the wrong content (a tensor, a YAML list, weights without a run's loop state, a JSON-lines file
of binary). Unreadable permissions are tried only when not running as root (root reads a
``chmod 000`` file). Each returns ``Case``s: the error line must name the key and the file."""
from __future__ import annotations

import os
import random
from pathlib import Path

import torch

from fuzz_schema import Case


def damaged_copies(source: bytes, folder: Path, stem: str, rng: random.Random, truncations: int = 6) -> list[Path]:
    """Empty, random bytes, and ``truncations`` cuts of ``source`` at random points."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {f"{stem}-empty": b"", f"{stem}-random": rng.randbytes(4096)}
    for cut in sorted(rng.sample(range(1, len(source)), min(truncations, len(source) - 1))):
        made[f"{stem}-cut{cut}"] = source[:cut]
    for name, content in made.items():
        (folder / name).write_bytes(content)
    return [folder / name for name in made]


def file_cases(folder: Path, rng: random.Random) -> list[Case]:
    """Bad files for every file-valued key, built in ``folder`` from a checkpoint of a run's
    layout (weights, epoch, loop state) and a real config; the line names the key and the file
    (a file has no range to state: ``says_allowed`` is off)."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "whole.ckpt"
    torch.save({"state_dict": {"lm.lora_A.weight": torch.zeros(64, 64)}, "epoch": 1, "global_step": 4, "loops": {}, "optimizer_states": []}, checkpoint)
    wrong = folder / "wrong"
    wrong.mkdir(exist_ok=True)
    torch.save(torch.zeros(3), wrong / "tensor.ckpt")
    torch.save({"state_dict": {"lm.other.lora_A.weight": torch.zeros(2, 2)}}, wrong / "weights_only.ckpt")
    torch.save({"state_dict": [1, 2]}, wrong / "listed.ckpt")
    checkpoints = [*damaged_copies(checkpoint.read_bytes(), folder / "ckpt", "last", rng), folder / "missing.ckpt", folder,
                   wrong / "tensor.ckpt", wrong / "listed.ckpt"]
    cases = [Case((f"--ckpt_path={path}",), "ckpt_path", str(path), says_allowed=False) for path in [*checkpoints, wrong / "weights_only.ckpt"]]
    cases += [Case((f"--model.init_weights={path}",), "model.init_weights", str(path), says_allowed=False) for path in checkpoints]
    config = (Path(__file__).resolve().parents[1] / "configs" / "frozenlake.yaml").read_bytes()
    (wrong / "list.yaml").write_text("- trainer\n- model\n")
    configs = [p for p in damaged_copies(config, folder / "yaml", "frozenlake", rng) if _not_a_valid_mapping(p)]
    cases += [Case(("-c", str(path)), "config file", str(path), says_allowed=False) for path in [*configs, wrong / "list.yaml", folder / "missing.yaml", folder]]
    corpus = b'{"id": "0", "contents": "a passage"}\n' * 20
    (folder / "corpus.jsonl").write_bytes(corpus)
    data = [*damaged_copies(corpus, folder / "data", "corpus", rng), folder / "missing.jsonl", folder]
    data = [p for p in data if not p.is_file() or p.stat().st_size == 0 or _binary(p)]  # a cut between lines is still a corpus
    for key, other in (("corpus_path", ""), ("questions_path", f"corpus_path: '{folder / 'corpus.jsonl'}', ")):  # questions need a corpus
        cases += [Case(("--data.env=search_qa", f"--data.env_kwargs={{{other}{key}: '{path}'}}"), f"data.env_kwargs.{key}", str(path), says_allowed=False)
                  for path in data]
    cases += [Case(("--data.env=webshop", f"--data.env_kwargs={{data_path: '{folder / 'missing'}'}}"), "data.env_kwargs.data_path", str(folder / "missing"), says_allowed=False)]
    if os.geteuid() != 0:  # root reads a chmod 000 file: the case would test nothing
        locked = folder / "locked.ckpt"
        locked.write_bytes(checkpoint.read_bytes())
        locked.chmod(0)
        cases.append(Case((f"--ckpt_path={locked}",), "ckpt_path", str(locked), says_allowed=False))
    return cases


def _not_a_valid_mapping(path: Path) -> bool:
    """A cut config that is still a valid YAML mapping is a valid (shorter) config, not bad input."""
    import yaml

    try:
        return not isinstance(yaml.safe_load(path.read_bytes().decode("utf-8")), dict)
    except (UnicodeDecodeError, yaml.YAMLError):
        return True


def _binary(path: Path) -> bool:
    try:
        path.read_bytes()[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False

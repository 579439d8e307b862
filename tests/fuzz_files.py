"""Input files as an attacker would make them (tests/test_cli_schema_fuzz.py): for ``--ckpt_path``,
``--model.init_weights``, ``-c`` and the environments' data paths, a missing file, a directory,
an empty file, random bytes, a real file truncated at random points, and the right format with
the wrong content (a tensor, a YAML list, weights without a run's loop state, a JSON-lines file
of binary). The environments' data (:func:`env_data_cases`): every file of an ALFWorld game
folder, of WebShop's data directory and of RWML's triplets, each damaged in turn in a copy of a
small valid layout, and a file where a folder is expected (and the reverse). Unreadable permissions are tried only when not running as root (root reads a
``chmod 000`` file). Each returns ``Case``s: the error line must name the key and the file."""
from __future__ import annotations

import functools
import json
import os
import random
import shutil
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
    cases += env_data_cases(folder / "envs", rng)
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


FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRIPLET = {"task": "reach the goal", "observation": "row 1: S F F", "action": "right", "next_observation": "row 1: F S F",
           "history": [["row 1: S F F", "left"]]}


def env_data_cases(folder: Path, rng: random.Random) -> list[Case]:
    """ALFWorld, WebShop and RWML data as an attacker would leave it: in a copy of a small valid
    layout (one ALFWorld game folder, tests/fixtures/webshop, a directory of triplets), each file
    in turn empty, random bytes, cut at random points (only the cuts that no longer parse),
    the right format with the wrong content, a directory in its place; and the data path a file
    or a folder without the data. The line names ``data.env_kwargs.<key>`` and the damaged path."""
    return [*_alfworld_cases(folder / "alfworld", rng), *_webshop_cases(folder / "webshop", rng), *_triplet_cases(folder / "rwml", rng)]


def _variants(source: bytes, folder: Path, stem: str, rng: random.Random, wrong: dict[str, bytes]) -> dict[str, bytes | None]:
    """Named damaged contents of one JSON file (None: a directory in its place)."""
    made = {path.name: path.read_bytes() for path in damaged_copies(source, folder / "made", stem, rng, truncations=4)}
    made = {name: content for name, content in made.items() if not _parses(content)}  # a cut that still parses is a valid file
    return {**made, **{f"{stem}-{name}": content for name, content in wrong.items()}, f"{stem}-directory": None}


def _place(content: bytes | None, file: Path) -> None:
    if content is None:
        file.unlink()
        file.mkdir()
    else:
        file.write_bytes(content)


def _parses(content: bytes) -> bool:
    try:
        json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def _data_path_case(env: str, data_path: Path, value: Path) -> Case:
    """``--data.env=<env>`` with ``data_path`` as its data folder; the error names ``value``."""
    return Case((f"--data.env={env}", f"--data.env_kwargs={{data_path: '{data_path}'}}"), "data.env_kwargs.data_path", str(value), says_allowed=False)


def _damaged_data_copies(env: str, source: Path, relative: Path, wrong: dict, folder: Path, rng: random.Random) -> list[Case]:
    """For each file ``name`` of ``wrong`` and each of its :func:`_variants`: a copy of ``source``
    at ``<folder>/<variant>/<relative>`` with that file replaced, as ``env``'s data path."""
    cases = []
    for name, wrong_content in wrong.items():
        for variant, content in _variants((source / name).read_bytes(), folder, name, rng, wrong_content).items():
            root = folder / variant
            shutil.copytree(source, root / relative)
            _place(content, root / relative / name)
            cases.append(_data_path_case(env, root, root / relative / name))
    return cases


def _alfworld_cases(folder: Path, rng: random.Random) -> list[Case]:
    game = next((FIXTURES / "alfworld" / "json_2.1.1" / "train").glob("*/*/game.tw-pddl")).parent
    relative = game.relative_to(FIXTURES / "alfworld")
    wrong = {"traj_data.json": {"list": b'["pick_and_place_simple"]', "no_task_type": b'{"scene": {"floor_plan": "FloorPlan1"}}'},
             "game.tw-pddl": {"list": b'[{"solvable": true}]', "no_grammar": json.dumps({"pddl_domain": "(define)", "pddl_problem": "(define)", "solvable": True}).encode()}}

    case = functools.partial(_data_path_case, "alfworld")
    cases = _damaged_data_copies("alfworld", game, relative, wrong, folder, rng)
    empty_split = folder / "no-games" / "json_2.1.1" / "train"
    (empty_split / "some-task" / "trial_0").mkdir(parents=True)  # a game folder without its files
    not_a_tree = folder / "not-a-tree"
    (not_a_tree / "json_2.1.1").mkdir(parents=True)
    (not_a_tree / "json_2.1.1" / "train").write_text("a file where the split's folder should be\n")
    cases += [case(folder / "no-games", empty_split), case(not_a_tree, not_a_tree), case(folder / "empty-folder", folder / "empty-folder"),
              case(game / "traj_data.json", game / "traj_data.json")]  # a file where the data folder is expected
    (folder / "empty-folder").mkdir(parents=True, exist_ok=True)
    return cases


def _webshop_cases(folder: Path, rng: random.Random) -> list[Case]:
    source = FIXTURES / "webshop"
    record = json.loads((source / "items_shuffle_1000.json").read_text())[0]
    wrong = {"items_shuffle_1000.json": {"mapping": b'{"B000000001": {}}', "no_fields": json.dumps([{"asin": record["asin"]}]).encode()},
             "items_ins_v2_1000.json": {"list": b'[["B000000001", "long lasting"]]', "not_records": b'{"B000000001": ["long lasting"]}'},
             "items_human_ins.json": {"list": b'[{"instruction": "i need a deodorant"}]', "not_records": b'{"B000000001": [{"text": "a deodorant"}]}'},
             "reviews.json": {"mapping": b'{"B000000001": []}', "no_fields": b'[{"stars": 5}]'}}

    case = functools.partial(_data_path_case, "webshop")
    cases = _damaged_data_copies("webshop", source, Path("."), wrong, folder, rng)
    lacking = folder / "no-instructions"
    shutil.copytree(source, lacking)
    (lacking / "items_human_ins.json").unlink()
    (folder / "empty-folder").mkdir()
    cases += [case(lacking, lacking), case(folder / "empty-folder", folder / "empty-folder"),
              case(source / "reviews.json", source / "reviews.json")]  # a file where the data folder is expected
    return cases


def _triplet_cases(folder: Path, rng: random.Random) -> list[Case]:
    lines = b"".join(json.dumps({**TRIPLET, "action": action}).encode() + b"\n" for action in ("left", "right", "up", "down") * 5)

    def case(directory: Path, value: Path) -> Case:
        return Case(("--data.env=world_model", f"--data.env_kwargs={{directory: '{directory}'}}"), "data.env_kwargs.directory", str(value), says_allowed=False)

    made = {path.name: path.read_bytes() for path in damaged_copies(lines, folder / "made", "train", rng)}
    made = {name: content for name, content in made.items() if not _all_lines_parse(content)}  # a cut at a line's end is fewer triplets
    missing_field = {k: v for k, v in TRIPLET.items() if k != "next_observation"}
    made |= {"train-no_next_observation": lines + json.dumps(missing_field).encode() + b"\n", "train-list": b'["a", "b", "c"]\n',
             "train-history_text": json.dumps({**TRIPLET, "history": "left"}).encode() + b"\n", "train-blank_line": lines + b"\n" + lines,
             "train-directory": None}
    cases = []
    for variant, content in made.items():
        directory = folder / variant
        directory.mkdir(parents=True)
        (directory / "train.jsonl").touch()
        _place(content, directory / "train.jsonl")
        cases.append(case(directory, directory / "train.jsonl"))
    (folder / "no-triplets").mkdir()
    (folder / "a-file").write_bytes(lines)
    cases += [case(folder / "no-triplets", folder / "no-triplets" / "train.jsonl"), case(folder / "missing", folder / "missing" / "train.jsonl"),
              case(folder / "a-file", folder / "a-file")]  # a file where the triplets' folder is expected
    return cases


def _all_lines_parse(content: bytes) -> bool:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text.strip()) and all(_parses(line.encode()) for line in text.splitlines())

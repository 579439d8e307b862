"""Input files, checked before anything is built: each problem named in one line.

:func:`check_config_files` (``-c`` files), :func:`check_checkpoint` (``--ckpt_path``,
``model.init_weights``) and :func:`check_input_files` (the environments' data paths, with
:func:`check_env_data`: what ALFWorld, WebShop and RWML's world-model task read from them)
refuse files that are missing, empty, truncated, of another kind or unreadable: damaged JSON,
missing fields, a folder where a file belongs and the reverse. Each raises ``ValueError``
(``FileNotFoundError`` for a missing file); ``paw_lightning.cli.main`` prints it as one
``error:`` line and exits with code 2.
"""
from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from paw_lightning.cli_checks import KINDS, config_value

def _readable_file(path: str, key: str) -> Path:
    """``path`` as a ``Path`` if it is a readable, non-empty file; else a ``ValueError`` saying why
    (``FileNotFoundError`` for a missing one)."""
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"{key} '{path}': no such file")
    if file.is_dir():
        raise ValueError(f"{key} '{path}' is a directory, not a file")
    try:
        with file.open("rb") as handle:
            empty = not handle.read(1)
    except OSError as err:  # permissions, a broken mount
        raise ValueError(f"{key} '{path}' cannot be read: {err.strerror or err}") from None
    if empty:
        raise ValueError(f"{key} '{path}' is empty (0 bytes)")
    return file


def check_checkpoint(path: str, key: str, resume: bool) -> dict:
    """Open ``path`` as a paw_lightning checkpoint before anything else touches it: a readable
    torch zip archive (``torch.load(weights_only=True, mmap=True)``: tensors stay on disk) holding a
    ``state_dict``; to ``resume`` a run also the loop state. Returns its content; a ``ValueError``
    that names ``key``, the file and the reason otherwise."""
    file = _readable_file(path, key)
    if not zipfile.is_zipfile(file):
        raise ValueError(f"{key} '{path}' is not a checkpoint: not a torch zip archive (truncated, or another kind of file)")
    import torch

    try:
        content = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # a damaged archive, or objects weights_only refuses
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        raise ValueError(f"{key} '{path}' cannot be read as a checkpoint ({type(err).__name__}{': ' + reason if reason else ''})") from None
    if not isinstance(content, dict) or not isinstance(content.get("state_dict"), dict):
        raise ValueError(f"{key} '{path}' is not a paw_lightning checkpoint: it holds {type(content).__name__} without a state_dict")
    lacking = [name for name in ("epoch", "global_step", "loops") if name not in content]
    if resume and lacking:
        raise ValueError(f"{key} '{path}' cannot resume a run: it lacks {', '.join(lacking)} "
                         "(weights only: start a fresh fit from it with --model.init_weights)")
    return content


PATH_KWARGS = {"questions_path": "file", "corpus_path": "file", "data_path": "directory", "directory": "directory"}  # environments' data files (envs/*)
FULL_PARSE_BYTES = 64 * 2**20  # a JSON data file up to this size is parsed whole (the environment reads it whole anyway); a larger one: its ends


def check_input_files(config: Namespace) -> None:
    """``model.init_weights`` and the data paths of ``data.env_kwargs`` /
    ``data.evaluation.env_kwargs`` (:data:`PATH_KWARGS`), before any environment or model is
    built; then what the environment ``data.env`` reads there (:func:`check_env_data`)."""
    weights = config_value(config, "model.init_weights")
    if weights is not None:
        check_checkpoint(weights, "model.init_weights", resume=False)
    env = config_value(config, "data.env")
    base = dict(config_value(config, "data.env_kwargs") or {})
    for section in ("data.env_kwargs", "data.evaluation.env_kwargs"):
        kwargs = dict(config_value(config, section) or {})
        for name, kind in PATH_KWARGS.items():
            values = kwargs.get(name)
            for value in values if isinstance(values, list) else [values]:
                if value is None or (name == "directory" and env != "world_model"):
                    continue
                key = f"{section}.{name}"
                if not isinstance(value, str) or not value:
                    raise ValueError(f"{key} = {value!r}: must be the path of a {kind}")
                path = os.path.expandvars(value)  # the environments expand $VARIABLES too
                if kind == "directory":
                    _directory(path, key, must_exist=name != "directory")  # world_model: RWMLData may create it
                else:
                    _text_file(path, key)
        if section == "data.env_kwargs" or kwargs:  # the evaluation's environment: data.env_kwargs updated by its own
            merged = {**base, **kwargs} if section != "data.env_kwargs" else base
            check_env_data(env, merged, lambda name: f"{section if name in kwargs else 'data.env_kwargs'}.{name}",
                           collecting=config_value(config, "stages.rwml") is not None and not config_value(config, "ckpt_path"),
                           evaluation=section != "data.env_kwargs")


def _directory(path: str, key: str, must_exist: bool = True) -> Path:
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{key} '{path}' is a file, not a directory")
    if must_exist and not folder.is_dir():
        raise ValueError(f"{key} '{path}': no such directory")
    return folder


# ------------------------------------------------------------------- environments' data
def check_env_data(env: Any, kwargs: dict, key_of, collecting: bool = False, evaluation: bool = False) -> None:
    """What environment ``env`` (a registry name) will read from ``kwargs``' paths, read as it
    will and checked for the fields it takes, so that a damaged file fails in one line naming
    its key (``key_of(name)``) and the file, before the model loads:

    - ``alfworld`` (``data_path``, unless ``source: generated``): an official ``json_2.1.1`` tree;
      every game folder of the split (``traj_data.json`` with a ``task_type``, ``game.tw-pddl``
      with its PDDL and grammar), read by the environment's own loader (cached: read once);
    - ``webshop`` (``data_path``, unless ``source: generated``): the files ``find_files`` picks,
      each valid JSON of the kind WebShop reads (products: a list of records with their fields;
      attributes and instructions: mappings by asin; reviews: a list);
    - ``world_model`` (``directory``): ``<directory>/<split>.jsonl``, one triplet a line with its
      five fields; missing only if the RWMLData stage (``stages.rwml``) will collect it in this
      fit (``collecting``: then it is not read either) or for the evaluation's split.
    """
    if isinstance(env, str) and "." in env:  # the registry's own dotted path names the same environment
        from paw_lightning.envs.registry import ENV_REGISTRY

        env = next((name for name, target in ENV_REGISTRY.items() if target == env), env)
    if env in ("alfworld", "webshop") and kwargs.get("source", "auto") != "generated":
        variable = "ALFWORLD_DATA" if env == "alfworld" else "WEBSHOP_DATA"
        path, key = kwargs.get("data_path"), key_of("data_path")
        if path is None and os.path.isdir(os.path.expanduser(os.path.expandvars(os.environ.get(variable) or "/nonexistent"))):
            path, key = os.environ[variable], f"${variable} (data.env_kwargs.data_path unset)"  # what the environment reads then
        if not isinstance(path, str) or not path:
            return
        if env == "webshop":
            _check_webshop(os.path.expanduser(os.path.expandvars(path)), key)
        else:
            _check_alfworld(path, kwargs, key, explicit=not key.startswith("$"))
    elif env == "world_model" and isinstance(kwargs.get("directory"), str) and not collecting:
        split = kwargs.get("split", "train")
        if not isinstance(split, str):
            return  # the environment names a bad split itself
        file = Path(os.path.expandvars(kwargs["directory"])).expanduser() / f"{split}.jsonl"
        if os.path.lexists(file) or not evaluation:
            _check_triplets(file, key_of("directory"))


def _check_alfworld(path: str, kwargs: dict, key: str, explicit: bool = True) -> None:
    from paw_lightning.envs.alfworld.env import SPLITS, TASK_TYPES, find_official_root, official_games

    root = find_official_root(path)
    if root is None and not explicit:
        return  # $ALFWORLD_DATA without a tree: source auto plays generated games
    if root is None:
        raise ValueError(f"{key} '{path}' holds no official ALFWorld tree: it needs json_2.1.1/<{'|'.join(SPLITS.values())}>/<task>/<trial>/"
                         "(traj_data.json, game.tw-pddl) (source: generated plays generated games)")
    split, task_types = kwargs.get("split", "train"), kwargs.get("task_types")
    if split not in SPLITS or (task_types is not None and (not task_types or set(task_types) - set(TASK_TYPES))):
        return  # the environment names a bad split or task type itself
    try:
        games = official_games(root, split, tuple(task_types) if task_types is not None else TASK_TYPES)
    except ValueError as err:  # a damaged game file, named by the loader
        raise ValueError(f"{key}: {err}") from None
    if not games:
        raise ValueError(f"{key}: no playable ALFWorld games{' of types ' + ', '.join(task_types) if task_types else ''} in "
                         f"'{os.path.join(root, SPLITS[split])}' (a game is a folder with traj_data.json and game.tw-pddl)")


# the fields WebShop reads of the first record of each file (envs/webshop/data.py)
WEBSHOP_PRODUCT_FIELDS = ("asin", "category", "query", "name", "product_category", "small_description", "full_description")
WEBSHOP_INSTRUCTION_FIELDS = ("instruction", "instruction_attributes", "instruction_options")


def _check_webshop(data_dir: str, key: str) -> None:
    from paw_lightning.envs.webshop.data import find_files

    try:
        files = find_files(data_dir)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
    products = _json_file(files["products"], key, list)
    if products and not _has_fields(products[0], WEBSHOP_PRODUCT_FIELDS):
        raise ValueError(f"{key}: '{files['products']}' must hold a list of product records with {', '.join(WEBSHOP_PRODUCT_FIELDS)}; "
                         f"its first is {_shape(products[0])}")
    attributes = _json_file(files["attributes"], key, dict)
    first = next(iter(attributes.values()), {}) if attributes else {}
    if not isinstance(first, dict):
        raise ValueError(f"{key}: '{files['attributes']}' must map each asin to a record of attributes; its first is {_shape(first)}")
    instructions = _json_file(files["instructions"], key, dict)
    first = next(iter(instructions.values()), []) if instructions else []
    if not isinstance(first, list) or (first and not _has_fields(first[0], WEBSHOP_INSTRUCTION_FIELDS)):
        raise ValueError(f"{key}: '{files['instructions']}' must map each asin to a list of instruction records with "
                         f"{', '.join(WEBSHOP_INSTRUCTION_FIELDS)}; its first is {_shape(first)}")
    if files["reviews"] is not None:
        reviews = _json_file(files["reviews"], key, list)
        if reviews and not _has_fields(reviews[0], ("asin", "reviews")):
            raise ValueError(f"{key}: '{files['reviews']}' must hold a list of records with asin and reviews; its first is {_shape(reviews[0])}")


def _check_triplets(file: Path, key: str) -> None:
    """``<directory>/<split>.jsonl`` as ``read_triplets`` reads it (every line, when it is not huge)."""
    from paw_lightning.envs.world_model import Triplet

    fields = tuple(Triplet.__dataclass_fields__)
    if not os.path.lexists(file):
        raise FileNotFoundError(f"{key}: no world-model triplets at '{file}': the RWMLData stage collects them in a fit "
                                "(stages.rwml: configs/methods/rwml.yaml sets it), or point it at an earlier run's triplets")
    _readable_file(str(file), key)
    with file.open("rb") as handle:
        content = handle.read(FULL_PARSE_BYTES)
    text = _utf8(content, str(file), key, cut=file.stat().st_size > FULL_PARSE_BYTES)
    lines = text.splitlines()
    if file.stat().st_size > FULL_PARSE_BYTES:
        lines = lines[:-1]  # the last line read may be cut at the limit
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            cut = " (a file cut short?)" if number == len(lines) and line.strip() else ""
            raise ValueError(f"{key}: '{file}' line {number} is not a triplet: not valid JSON, column {err.colno}: {err.msg}{cut}") from None
        if not isinstance(item, dict):
            raise ValueError(f"{key}: '{file}' line {number} is not a triplet: it must be a JSON object with {', '.join(fields)}, not {_shape(item)}")
        lacking = [name for name in fields if name not in item]
        wrong = [name for name in fields if name in item and not isinstance(item[name], list if name == "history" else str)]
        if lacking or wrong:
            reason = f"it lacks {', '.join(lacking)}" if lacking else \
                f"{wrong[0]} must be {'a list of [observation, action] pairs' if wrong[0] == 'history' else 'a string'}, not {_shape(item[wrong[0]])}"
            raise ValueError(f"{key}: '{file}' line {number} is not a triplet: {reason}")
    if not any(line.strip() for line in lines):
        raise ValueError(f"{key}: '{file}' holds no triplets")


def _json_file(path: str, key: str, kind: type):
    """The content of a JSON data file of ``kind`` (whole if not over :data:`FULL_PARSE_BYTES`;
    else ``kind()`` after checking that it opens and closes as one), or a ``ValueError`` naming
    the file and where it breaks."""
    file = _readable_file(path, key)
    size = file.stat().st_size
    opens, closes = ("[", "]") if kind is list else ("{", "}")
    if size > FULL_PARSE_BYTES:  # the ends only: a truncated file does not close
        with file.open("rb") as handle:
            head = handle.read(4096)
            handle.seek(max(0, size - 4096))
            tail = handle.read()
        if not head.lstrip().startswith(opens.encode()) or not tail.rstrip().endswith(closes.encode()):
            raise ValueError(f"{key}: '{path}' is not a JSON {KINDS[kind.__name__][2:]} (it must start with {opens} and end with {closes}: a file cut short?)")
        return kind()
    text = _utf8(file.read_bytes(), path, key)
    try:
        content = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{key}: '{path}' is not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    if not isinstance(content, kind):
        raise ValueError(f"{key}: '{path}' must hold a JSON {KINDS[kind.__name__][2:]}, not {_shape(content)}")
    return content


def _utf8(content: bytes, path: str, key: str, cut: bool = False) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as err:
        if cut and err.start >= len(content) - 4:
            return content[:err.start].decode("utf-8")
        raise ValueError(f"{key}: '{path}' is not text: byte {err.start} is not UTF-8") from None


def _has_fields(record, fields: tuple[str, ...]) -> bool:
    return isinstance(record, dict) and all(name in record for name in fields)


def _shape(value) -> str:
    """A short description of a JSON value: ``a dict with keys a, b``, ``a list``, ``'text'``."""
    if isinstance(value, dict):
        return f"a mapping with keys {', '.join(map(str, list(value)[:6])) or '(none)'}"
    return f"{KINDS.get(type(value).__name__, type(value).__name__)}{f' ({value!r:.40})' if isinstance(value, (str, int, float)) else ''}"


def _text_file(path: str, key: str) -> None:
    """A data file must be readable, non-empty and start as text (JSON lines) or as a parquet file."""
    with _readable_file(path, key).open("rb") as handle:
        head = handle.read(4096)
    if head.startswith(b"PAR1"):
        return
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:  # not a character cut at the 4096th byte
            raise ValueError(f"{key} '{path}' is not a text (JSON lines) or parquet file: byte {err.start} is not UTF-8") from None


def check_config_files(args: list[str]) -> None:
    """Fail early, naming the file, when a ``-c``/``--config`` file is missing, a directory,
    unreadable, not text, not valid YAML or not a mapping of sections (the parser's own message
    would hide the file name)."""
    for flag, value in zip(args, args[1:]):
        if flag not in ("-c", "--config"):
            continue
        path = Path(value)
        if not path.exists():
            raise FileNotFoundError(f"config file '{value}' does not exist")
        if path.is_dir():
            raise ValueError(f"config file '{value}' is a directory, not a YAML file")
        try:
            content = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise ValueError(f"config file '{value}' cannot be read: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"config file '{value}' is not text: byte {err.start} is not UTF-8") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err)
            raise ValueError(f"config file '{value}' is not valid YAML{where}: {problem}") from err
        if content is None:  # the parser refuses an empty config without naming it
            raise ValueError(f"config file '{value}' is empty (or only comments): it must hold at least one section (trainer:, model:, data:, …)")
        if not isinstance(content, dict):
            raise ValueError(f"config file '{value}' must be a mapping of sections (trainer:, model:, data:, …), not a {type(content).__name__}")
        for section in ("trainer", "model", "data", "stages"):
            if content.get(section) is not None and not isinstance(content[section], dict):
                raise ValueError(f"config file '{value}': section '{section}' must be a mapping of settings, not {content[section]!r}")


# ------------------------------------------------------------------------- one line

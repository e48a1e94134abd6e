"""Builds the Lambda asset without Docker: wheels for the Lambda platform + our source + the tokenizer encoding.

`build_lambda_asset()` produces `.build/lambda/<mode>-<hash>/`, laid out like the repository so import paths match:

    om_lib/ functions/            the service code (no tests, no om_cli, no __pycache__)
    tiktoken_cache/<sha1(url)>    the decompressed o200k_base file, verified (TIKTOKEN_CACHE_DIR points here)
    <wheels>                      `full` mode only: infra/requirements-lambda.txt installed by pip with
                                  --platform manylinux_2_28_x86_64/manylinux2014_x86_64 --python-version 3.12
                                  --implementation cp --only-binary=:all: --no-compile

The folder name is a hash of everything that goes in (requirements, platform, source files, the encoding, this
builder), so a repeated synth reuses it; the installed wheels are cached separately by the requirements' hash, so a
source change re-copies (hard-links) them instead of reinstalling. A build is written to a temporary folder and
renamed into place, so a concurrent or interrupted build never leaves a half-built asset behind.

No `.pyc` files are shipped unless a matching interpreter is found (`OM_LAMBDA_PYTHON`, or `python3.12` on PATH):
bytecode compiled by another Python version is dead weight, and pip's timestamp-based `.pyc` would be invalidated by
the CDK CLI's zip (it resets mtimes). With SnapStart the import cost is paid once, at version publish.

Run it directly to build and print the size: `python infra/asset_builder.py [full|source]`.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ''):  # `python infra/asset_builder.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.constants import (
    ASSET_MODES,
    ASSET_TIKTOKEN_DIR,
    LAMBDA_ARCHITECTURE,
    LAMBDA_PYTHON_VERSION,
    LAMBDA_WHEEL_PLATFORMS,
    REPO_ROOT,
)
from om_lib.adapters.tiktoken_counter import CACHE_FILE_NAME, EXPECTED_SHA256, SHIPPED_FILE

BUILD_FORMAT = '1'
REQUIREMENTS_FILE = Path(__file__).resolve().parent / 'requirements-lambda.txt'
DEFAULT_BUILD_ROOT = REPO_ROOT / '.build'
SOURCE_PACKAGES = ('om_lib', 'functions')
# Never shipped: bytecode, caches, tests, and anything a wheel carries that Lambda cannot use.
_EXCLUDED_DIRS = frozenset({'__pycache__', '.pytest_cache', '.mypy_cache', '.ruff_cache', 'tests', 'test'})
_EXCLUDED_SUFFIXES = ('.pyc', '.pyo')
_KEEP_BUILDS = 3


class AssetBuildError(RuntimeError):
    """The asset could not be built (pip failed, the encoding is missing or corrupt)."""


@dataclass(frozen=True)
class LambdaAsset:
    """A built asset folder, ready for `lambda.Code.from_asset`."""

    path: Path
    mode: str
    content_hash: str
    size_bytes: int
    reused: bool

    @property
    def size_mb(self) -> float:
        """Unzipped size in MB (Lambda's limit is 250 MB)."""
        return self.size_bytes / 1_000_000


def _source_files(repo_root: Path) -> list[Path]:
    files: list[Path] = []
    for package in SOURCE_PACKAGES:
        for root, dirs, names in os.walk(repo_root / package):
            dirs[:] = sorted(d for d in dirs if d not in _EXCLUDED_DIRS and not d.startswith('.'))
            for name in sorted(names):
                if name.endswith(_EXCLUDED_SUFFIXES) or name == 'conftest.py' or name.startswith('test_'):
                    continue
                files.append(Path(root, name).relative_to(repo_root))
    return files


def _hash_inputs(mode: str, repo_root: Path, requirements: Path, sources: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for part in (BUILD_FORMAT, mode, LAMBDA_PYTHON_VERSION, LAMBDA_ARCHITECTURE, *LAMBDA_WHEEL_PLATFORMS):
        digest.update(part.encode() + b'\0')
    digest.update(Path(__file__).read_bytes())
    if mode == 'full':
        digest.update(requirements.read_bytes())
    for rel in sources:
        digest.update(rel.as_posix().encode() + b'\0')
        digest.update(hashlib.sha256((repo_root / rel).read_bytes()).digest())
    return digest.hexdigest()


def _requirements_hash(requirements: Path) -> str:
    digest = hashlib.sha256()
    for part in (BUILD_FORMAT, LAMBDA_PYTHON_VERSION, *LAMBDA_WHEEL_PLATFORMS):
        digest.update(part.encode() + b'\0')
    digest.update(requirements.read_bytes())
    return digest.hexdigest()[:20]


def _install_command(requirements: Path, target: Path) -> list[str]:
    if importlib.util.find_spec('pip') is not None:
        command = [sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check', '--no-input', '--quiet']
        for platform in LAMBDA_WHEEL_PLATFORMS:
            command += ['--platform', platform]
        return [
            *command,
            '--implementation',
            'cp',
            '--python-version',
            LAMBDA_PYTHON_VERSION,
            '--only-binary=:all:',
            '--no-compile',
            '--target',
            str(target),
            '-r',
            str(requirements),
        ]
    uv = shutil.which('uv')
    if uv is None:
        raise AssetBuildError('neither pip (in this Python) nor uv (on PATH) is available to install the wheels')
    # uv names the platform by its oldest glibc; 2.28 admits tiktoken's manylinux_2_28 wheels.
    return [
        uv,
        'pip',
        'install',
        '--quiet',
        '--python-platform',
        f'{LAMBDA_ARCHITECTURE}-manylinux_2_28',
        '--python-version',
        LAMBDA_PYTHON_VERSION,
        '--only-binary',
        ':all:',
        '--no-compile',
        '--target',
        str(target),
        '-r',
        str(requirements),
    ]


def _remove_unshippable(root: Path) -> None:
    """Tests, caches, bytecode and console scripts (their shebangs name the build machine's Python)."""
    shutil.rmtree(root / 'bin', ignore_errors=True)
    for current, dirs, names in os.walk(root, topdown=True):
        for name in [d for d in dirs if d in _EXCLUDED_DIRS]:
            shutil.rmtree(Path(current, name))
            dirs.remove(name)
        for name in names:
            if name.endswith(_EXCLUDED_SUFFIXES):
                Path(current, name).unlink()


def _dependencies(requirements: Path, build_root: Path) -> Path:
    """The installed wheels for `requirements`, built once per requirements hash."""
    final = build_root / 'lambda-deps' / _requirements_hash(requirements)
    if final.is_dir():
        return final
    tmp = final.parent / f'.tmp-{uuid.uuid4().hex}'
    tmp.mkdir(parents=True)
    try:
        result = subprocess.run(_install_command(requirements, tmp), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise AssetBuildError(
                f'installing {requirements.name} for {LAMBDA_ARCHITECTURE}/cp{LAMBDA_PYTHON_VERSION} failed:\n'
                f'{result.stderr.strip() or result.stdout.strip()}'
            )
        _remove_unshippable(tmp)
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; if another build got there first, keep theirs (same inputs, same content)."""
    try:
        tmp.rename(final)
    except OSError:
        if not final.is_dir():
            raise


def _link_or_copy(src: str, dst: str) -> None:
    # Hard links: a source change re-assembles the asset in a second instead of copying ~85 MB of wheels.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _seed_tokenizer(target: Path) -> None:
    """Decompress the shipped o200k_base file under tiktoken's cache name, verified against tiktoken's hash."""
    try:
        data = gzip.decompress(SHIPPED_FILE.read_bytes())
    except (OSError, EOFError) as exc:
        raise AssetBuildError(f'cannot read the shipped encoding {SHIPPED_FILE}: {exc}') from exc
    if hashlib.sha256(data).hexdigest() != EXPECTED_SHA256:
        raise AssetBuildError(f'{SHIPPED_FILE} does not match o200k_base sha256 {EXPECTED_SHA256}')
    cache_dir = target / ASSET_TIKTOKEN_DIR
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / CACHE_FILE_NAME).write_bytes(data)


def _matching_python() -> str | None:
    """An interpreter of the Lambda runtime's version, to compile `.pyc` that the runtime will actually use."""
    candidate = os.environ.get('OM_LAMBDA_PYTHON') or shutil.which(f'python{LAMBDA_PYTHON_VERSION}')
    if not candidate:
        return None
    probe = subprocess.run(
        [candidate, '-c', 'import sys; print("%d.%d" % sys.version_info[:2])'],
        capture_output=True,
        text=True,
        check=False,
    )
    return candidate if probe.stdout.strip() == LAMBDA_PYTHON_VERSION else None


def _compile_bytecode(target: Path) -> bool:
    python = _matching_python()
    if python is None:
        return False
    # unchecked-hash: valid whatever the zip does to mtimes; the asset is immutable once built.
    subprocess.run(
        [python, '-m', 'compileall', '-q', '-j0', '--invalidation-mode', 'unchecked-hash', str(target)],
        check=True,
        capture_output=True,
    )
    return True


def _size(root: Path) -> int:
    return sum(path.stat().st_size for path in _walk_files(root))


def _walk_files(root: Path) -> Iterator[Path]:
    for current, _dirs, names in os.walk(root):
        for name in names:
            yield Path(current, name)


def _prune(builds: Path, mode: str, keep: Path) -> None:
    """Keep the newest few builds of `mode` (older ones only waste disk); never the one just returned."""
    previous = sorted(
        (p for p in builds.glob(f'{mode}-*') if p.is_dir() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for stale in previous[_KEEP_BUILDS - 1 :]:
        shutil.rmtree(stale, ignore_errors=True)


def build_lambda_asset(
    mode: str = 'full',
    *,
    repo_root: Path = REPO_ROOT,
    build_root: Path = DEFAULT_BUILD_ROOT,
    requirements: Path = REQUIREMENTS_FILE,
) -> LambdaAsset:
    """Build (or reuse) the Lambda asset folder.

    Args:
        mode: `full` (wheels + source + encoding: what you deploy) or `source` (source + encoding: tests, quick synth).
        repo_root: Where `om_lib/` and `functions/` are.
        build_root: Where builds go (`.build/` at the repository root).
        requirements: The runtime requirements (infra/requirements-lambda.txt).

    Raises:
        AssetBuildError: pip failed or the tokenizer encoding is missing or corrupt.
        ValueError: An unknown mode.
    """
    if mode not in ASSET_MODES:
        raise ValueError(f'omAssetMode must be one of {", ".join(ASSET_MODES)}, got {mode!r}')
    sources = _source_files(repo_root)
    content_hash = _hash_inputs(mode, repo_root, requirements, sources)
    builds = build_root / 'lambda'
    final = builds / f'{mode}-{content_hash[:20]}'
    if final.is_dir():
        os.utime(final)  # recently used: kept by _prune
        return LambdaAsset(final, mode, content_hash, _size(final), reused=True)

    builds.mkdir(parents=True, exist_ok=True)
    tmp = builds / f'.tmp-{mode}-{uuid.uuid4().hex}'
    try:
        if mode == 'full':
            shutil.copytree(_dependencies(requirements, build_root), tmp, copy_function=_link_or_copy)
        else:
            tmp.mkdir()
        for rel in sources:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / rel, tmp / rel)
        _seed_tokenizer(tmp)
        compiled = _compile_bytecode(tmp) if mode == 'full' else False
        manifest = {'mode': mode, 'hash': content_hash, 'python': LAMBDA_PYTHON_VERSION, 'pyc': compiled}
        (tmp / 'om_asset.json').write_text(json.dumps(manifest, indent=2) + '\n', encoding='utf-8')
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(builds, mode, final)
    return LambdaAsset(final, mode, content_hash, _size(final), reused=False)


def main(argv: list[str] | None = None) -> int:
    """Build the asset and print where it is and how big it is."""
    args = sys.argv[1:] if argv is None else argv
    asset = build_lambda_asset(args[0] if args else 'full')
    state = 'reused' if asset.reused else 'built'
    print(f'{state} {asset.mode} asset {asset.path} ({asset.size_mb:.1f} MB unzipped)')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())

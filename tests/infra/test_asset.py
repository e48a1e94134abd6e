"""The real Lambda asset (wheels for the Lambda platform + source + encoding), built without Docker.

The first run installs the wheels from the package index (about 10-20 s); later runs reuse `.build/` (keyed by a hash
of everything that goes in), so the checks below always look at the asset the current code would deploy.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.asset_builder import LambdaAsset, build_lambda_asset
from infra.constants import ALL_FUNCTIONS, ASSET_TIKTOKEN_DIR, LAMBDA_ARCHITECTURE, LAMBDA_PYTHON_VERSION, REPO_ROOT
from om_lib.adapters.tiktoken_counter import CACHE_FILE_NAME, EXPECTED_SHA256

_PY = LAMBDA_PYTHON_VERSION.replace('.', '')
_MINOR = int(LAMBDA_PYTHON_VERSION.split('.')[1])
LAMBDA_LIMIT_BYTES = 250 * 1024 * 1024
FORBIDDEN_TOP_LEVEL = {'moto', 'aws_cdk', 'jsii', 'constructs', 'cdk_nag', 'pytest', '_pytest', 'tests', 'om_cli'}


def _tag_fits_lambda(tag: str) -> bool:
    """A wheel tag the python3.12 x86_64 runtime can load: pure python, cp312, or abi3 from an older CPython."""
    python, abi, platform = tag.split('-')
    if abi == 'none' and platform == 'any':
        return python.startswith('py') or python == f'cp{_PY}'
    if not re.fullmatch(rf'manylinux(1|2010|2014|_2_\d+)_{LAMBDA_ARCHITECTURE}', platform):
        return False
    if abi == f'cp{_PY}':
        return python == f'cp{_PY}'
    match = re.fullmatch(r'cp3(\d+)', python)
    return abi == 'abi3' and match is not None and int(match[1]) <= _MINOR


@pytest.fixture(scope='module')
def asset() -> LambdaAsset:
    built = build_lambda_asset('full')
    print(f'\n{"reused" if built.reused else "built"} Lambda asset {built.path.name}: {built.size_mb:.1f} MB unzipped')
    return built


def test_wheel_tags_fit_the_lambda_runtime(asset: LambdaAsset) -> None:
    wheels = list(asset.path.glob('*.dist-info/WHEEL'))
    assert len(wheels) > 10
    binary = 0
    for wheel in wheels:
        tags = [line.split(':', 1)[1].strip() for line in wheel.read_text().splitlines() if line.startswith('Tag:')]
        assert tags, wheel
        assert all(_tag_fits_lambda(tag) for tag in tags), (wheel.parent.name, tags)
        binary += any(not tag.endswith('-any') for tag in tags)
    assert binary >= 3  # pydantic-core, tiktoken, xxhash at least
    # Extension modules are built for the runtime, never for the machine that built the asset.
    for extension in asset.path.rglob('*.so'):
        assert re.search(rf'(cpython-{_PY}-{LAMBDA_ARCHITECTURE}-linux-gnu|abi3)\.so$', extension.name), extension


def test_runtime_dependencies_are_inside_and_nothing_else(asset: LambdaAsset) -> None:
    top_level = {p.name for p in asset.path.iterdir()}
    packages = (
        'pydantic',
        'pydantic_core',
        'tiktoken',
        'xxhash',
        'aws_lambda_powertools',
        'aws_xray_sdk',
        'boto3',
        'google',
    )
    for package in packages:
        assert package in top_level, package
    assert not FORBIDDEN_TOP_LEVEL & top_level
    assert not [p for p in asset.path.rglob('*') if p.is_dir() and p.name in {'tests', '__pycache__'}]
    assert not list(asset.path.rglob('*.pyc'))  # no bytecode of the wrong Python version
    assert not (asset.path / 'bin').exists()


def test_source_and_encoding_are_inside(asset: LambdaAsset) -> None:
    for spec in ALL_FUNCTIONS:
        module = spec.handler.rsplit('.', 1)[0].replace('.', '/') + '.py'
        assert (asset.path / module).is_file(), module
    assert (asset.path / 'functions/api/handler.py').is_file()
    assert (asset.path / 'om_lib/adapters/data/o200k_base.tiktoken.gz').is_file()
    assert (asset.path / 'functions/reflection/state_machine.asl.json').is_file()
    shipped = {p.relative_to(asset.path) for p in (asset.path / 'om_lib').rglob('*.py')}
    expected = {p.relative_to(REPO_ROOT) for p in (REPO_ROOT / 'om_lib').rglob('*.py') if '__pycache__' not in p.parts}
    assert shipped == expected
    seeded = asset.path / ASSET_TIKTOKEN_DIR / CACHE_FILE_NAME
    assert hashlib.sha256(seeded.read_bytes()).hexdigest() == EXPECTED_SHA256


def test_seeded_cache_loads_o200k_without_network(asset: LambdaAsset) -> None:
    # tiktoken reads the pre-seeded (read-only on Lambda) cache and never downloads; a bogus proxy proves no network.
    env = {
        **os.environ,
        'TIKTOKEN_CACHE_DIR': str(asset.path / ASSET_TIKTOKEN_DIR),
        'HTTPS_PROXY': 'http://127.0.0.1:9',
        'HTTP_PROXY': 'http://127.0.0.1:9',
    }
    code = 'import tiktoken; print(len(tiktoken.get_encoding("o200k_base").encode("hello world")))'
    result = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '2'


def test_asset_fits_lambda_and_is_reused(asset: LambdaAsset) -> None:
    assert asset.size_bytes < LAMBDA_LIMIT_BYTES
    again = build_lambda_asset('full')
    assert again.reused and again.path == asset.path


def test_source_mode_has_no_wheels(tmp_path: Path) -> None:
    source = build_lambda_asset('source', build_root=tmp_path)
    assert not list(source.path.glob('*.dist-info'))
    assert (source.path / 'functions/api/handler.py').is_file()
    assert (source.path / ASSET_TIKTOKEN_DIR / CACHE_FILE_NAME).is_file()
    assert source.size_mb < 20

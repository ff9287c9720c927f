"""custom_ops/ort_headers.py without the network: which of the machine's apt sources it takes the mirror from, and
that the fetch runs apt with a private configuration only (sources list, lists, cache in a scratch folder) and
unpacks the header into the cache. apt-get itself is replaced by a stub that hands over a locally built .deb."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from custom_ops import ort_headers

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
OTHER = """\
Types: deb
URIs: https://vendor.example/apt
Suites: nodistro
Components: main
Signed-By: /usr/share/keyrings/vendor.gpg
"""


def _sources(tmp_path: Path, files: dict[str, str]) -> list[ort_headers.AptSource]:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return ort_headers.machine_apt_sources((tmp_path / "sources.list", d))


def test_mirror_is_the_machines_debian_archive(tmp_path):
    sources = _sources(tmp_path, {"a-vendor.sources": OTHER, "debian.sources": DEB822,
                                  "old.list.disabled": "deb http://wrong.example/debian bookworm main\n"})
    mirror = ort_headers.debian_mirror(sources)
    assert mirror.uri == "http://mirror.example/debian"
    assert mirror.signed_by == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert all(s.uri != "http://wrong.example/debian" for s in sources)  # only .list / .sources files count


def test_one_line_sources_and_disabled_stanzas(tmp_path):
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian/ bookworm main contrib\n")
    sources = _sources(tmp_path, {"x.sources": DEB822.replace("Types: deb\n", "Types: deb\nEnabled: no\n", 1)})
    assert ort_headers.debian_mirror(sources) == ort_headers.AptSource(
        "http://one.example/debian/", ("bookworm",), ("main", "contrib"), "/k.gpg")


def test_no_debian_source_is_a_clear_refusal(tmp_path, monkeypatch):
    sources = _sources(tmp_path, {"v.sources": OTHER})
    monkeypatch.setattr(ort_headers, "machine_apt_sources", lambda: sources)
    with pytest.raises(ort_headers.HeadersUnavailable, match="no Debian archive found.*ONNXRUNTIME_ROOT"):
        ort_headers.fetch(tmp_path / "cache", log=lambda m: None)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not found (not a Debian-like machine)")
def test_fetch_uses_a_private_apt_setup_and_unpacks_the_header(tmp_path, monkeypatch):
    # A stand-in for the real .deb, built locally: usr/include/onnxruntime/onnxruntime_c_api.h
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text("Package: libonnxruntime-dev\nVersion: 1.21.0+dfsg-1\n"
                                            "Architecture: amd64\nMaintainer: t <t@t>\nDescription: t\n")
    (pkg / "usr/include/onnxruntime").mkdir(parents=True)
    (pkg / "usr/include/onnxruntime/onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 21\n")
    deb = tmp_path / "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-b", str(pkg), str(deb)], check=True, capture_output=True)

    sources = _sources(tmp_path, {"debian.sources": DEB822})
    monkeypatch.setattr(ort_headers, "machine_apt_sources", lambda: sources)
    calls, real_run = [], ort_headers._run

    def fake_run(cmd, what, cwd=None, timeout=300):
        if cmd[0] != "apt-get":
            return real_run(cmd, what, cwd, timeout)
        options = dict(cmd[i + 1].split("=", 1) for i, c in enumerate(cmd) if c == "-o")
        calls.append((cmd[-2:] if cmd[-2] == "download" else cmd[-1:], options,
                      Path(options["Dir::Etc::SourceList"]).read_text()))
        if cmd[-2] == "download":
            shutil.copy(deb, cwd)
        return ""

    monkeypatch.setattr(ort_headers, "_run", fake_run)
    cache = tmp_path / "build" / "ort-headers"
    include = ort_headers.fetch(cache, log=lambda m: None)
    assert include == cache / "usr" / "include" / "onnxruntime" and ort_headers.api_version(include) == 21
    assert [c[0] for c in calls] == [["update"], ["download", "libonnxruntime-dev"]]
    for _, options, sources_list in calls:
        for key in ("Dir::Etc::SourceList", "Dir::Etc::SourceParts", "Dir::State::Lists", "Dir::Cache"):
            assert Path(options[key]).is_relative_to(cache.parent) and "qo-apt-" in options[key], (key, options)
        assert sources_list == ("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                                "http://mirror.example/debian trixie main\n")
    assert not list(cache.parent.glob("qo-apt-*")), "the scratch folder is removed"
    monkeypatch.setenv("QO_ORT_HEADERS_CACHE", str(cache))
    monkeypatch.delenv("ONNXRUNTIME_ROOT", raising=False)
    assert ort_headers.find() == include and ort_headers.ensure(log=lambda m: None) == include  # no second fetch
    assert len(calls) == 2

"""ONNX Runtime's C API header (onnxruntime_c_api.h), fetched from Debian's `libonnxruntime-dev` into a cache folder.

The registration layer (src/ort_register.cc) needs only that one header: it links nothing from onnxruntime (the
API table arrives through RegisterCustomOps). Debian 13 (trixie) ships it in `libonnxruntime-dev` (ORT 1.21,
ORT_API_VERSION 21, Expat license, ~85 KB). On any Debian-like machine this module downloads that .deb through a
PRIVATE apt configuration in a scratch folder (its own sources list, lists and cache), so the machine's apt setup is
never touched, and unpacks it with `dpkg-deb -x`:

    scratch/sources.list   "deb [signed-by=<the machine's Debian keyring>] <the machine's Debian mirror> trixie main"
    apt-get -o Dir::Etc::SourceList=... -o Dir::Etc::SourceParts=<empty> -o Dir::State::Lists=... \
            -o Dir::Cache=... update;   apt-get ... download libonnxruntime-dev;   dpkg-deb -x *.deb CACHE

The mirror address is read from the machine's own apt sources at run time (nothing is hard-coded here).

Order of look-up (first hit wins), `find()`:
  1. $ONNXRUNTIME_ROOT (a release package `onnxruntime-linux-x64-<ver>/` or a source checkout) holding the header;
  2. the cache folder ($QO_ORT_HEADERS_CACHE, default custom_ops/build/ort-headers/) from an earlier fetch.
`ensure()` adds 3.: the apt fetch above. Command line: `python -m custom_ops.ort_headers` prints the root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_CACHE = PACKAGE_DIR / "build" / "ort-headers"
DEBIAN_PACKAGE = "libonnxruntime-dev"
DEBIAN_SUITE = "trixie"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
HEADER = "onnxruntime_c_api.h"
# Relative to a root: release package, Debian package (usr/), source checkout.
HEADER_DIRS = ("include", "include/onnxruntime", "include/onnxruntime/core/session")
MIN_API_VERSION = 16  # what ort_register.cc asks for (CreateKernelV2 / KernelComputeV2)
APT_SOURCE_FILES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


class HeadersUnavailable(RuntimeError):
    """The header could not be found or fetched; the message says why and how to provide it."""


HOW_TO = ("set ONNXRUNTIME_ROOT to an ONNX Runtime release package or source tree holding include/" + HEADER +
          ", or run `python -m custom_ops.ort_headers` on a Debian/Ubuntu machine that reaches a Debian mirror "
          "(downloads the " + DEBIAN_PACKAGE + " .deb of Debian 13 through a private apt setup)")


def cache_dir() -> Path:
    return Path(os.environ.get("QO_ORT_HEADERS_CACHE") or DEFAULT_CACHE)


def header_dir(root: Path) -> Path | None:
    """The folder under root that holds onnxruntime_c_api.h, or None."""
    for sub in HEADER_DIRS:
        if (root / sub / HEADER).is_file():
            return root / sub
    return None


def api_version(include_dir: Path) -> int | None:
    match = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", (include_dir / HEADER).read_text(errors="replace"))
    return int(match.group(1)) if match else None


def find() -> Path | None:
    """The include folder holding onnxruntime_c_api.h (ONNXRUNTIME_ROOT, then the cache), without fetching."""
    roots = []
    if os.environ.get("ONNXRUNTIME_ROOT"):
        roots.append(Path(os.environ["ONNXRUNTIME_ROOT"]))
    roots.append(cache_dir() / "usr")
    for root in roots:
        found = header_dir(root)
        if found is not None:
            return found
    return None


# ---------------- the machine's apt sources -> one Debian mirror ----------------

@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas, current, key = [], {}, None
    for line in text.splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, None
        elif line[:1].isspace() and key:
            current[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            current[key] = value.strip()
    return stanzas


def _one_line_sources(text: str) -> list[AptSource]:
    sources = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        options, rest = {}, line[4:].strip()
        if rest.startswith("["):
            inside, _, rest = rest[1:].partition("]")
            for item in inside.split():
                k, _, v = item.partition("=")
                options[k.lower()] = v
        fields = rest.split()
        if len(fields) >= 3:
            sources.append(AptSource(fields[0], (fields[1],), tuple(fields[2:]), options.get("signed-by")))
    return sources


def machine_apt_sources(paths=APT_SOURCE_FILES) -> list[AptSource]:
    """Binary ("deb") sources configured on this machine, in apt's reading order (read only)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".list", ".sources"))
        elif path.is_file():
            files.append(path)
    sources: list[AptSource] = []
    for file in files:
        try:
            text = file.read_text(errors="replace")
        except OSError:
            continue
        if file.suffix == ".sources":
            for st in _deb822_stanzas(text):
                if "deb" not in st.get("types", "").split() or st.get("enabled", "yes").lower() == "no":
                    continue
                signed = st.get("signed-by")
                signed = signed if signed and "\n" not in signed and "BEGIN PGP" not in signed else None
                for uri in st.get("uris", "").split():
                    sources.append(AptSource(uri, tuple(st.get("suites", "").split()),
                                             tuple(st.get("components", "").split()), signed))
        else:
            sources += _one_line_sources(text)
    return sources


_SUITE_SUFFIXES = ("-security", "-updates", "-backports", "-proposed-updates")


def debian_mirror(sources: list[AptSource]) -> AptSource | None:
    """The machine's main Debian archive: a source with component main, a release suite (not -security/-updates),
    signed by Debian's archive keyring or served from a path named debian (not debian-security)."""
    for s in sources:
        if "main" not in s.components or not any(not x.endswith(_SUITE_SUFFIXES) for x in s.suites):
            continue
        path = s.uri.rstrip("/").rsplit("/", 1)[-1]
        if "security" in s.uri or "debian-security" in path:
            continue
        if (s.signed_by and "debian-archive-keyring" in s.signed_by) or path == "debian":
            return s
    return None


# ---------------- fetch ----------------

def _run(cmd: list[str], what: str, cwd: Path | None = None, timeout: int = 300) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HeadersUnavailable(f"{what}: {exc}") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise HeadersUnavailable(f"{what} failed (exit {result.returncode}): {' | '.join(tail)}")
    return result.stdout


def fetch(cache: Path | None = None, log=print) -> Path:
    """Download and unpack libonnxruntime-dev (Debian 13) into cache; returns the include folder."""
    cache = cache or cache_dir()
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise HeadersUnavailable(f"{tool} not found (not a Debian-like machine); {HOW_TO}")
    mirror = debian_mirror(machine_apt_sources())
    if mirror is None:
        raise HeadersUnavailable(f"no Debian archive found in the machine's apt sources; {HOW_TO}")
    keyring = mirror.signed_by or (str(DEBIAN_KEYRING) if DEBIAN_KEYRING.is_file() else None)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qo-apt-", dir=cache.parent) as scratch_name:
        scratch = Path(scratch_name)
        for sub in ("sources.list.d", "lists/partial", "cache/archives/partial", "download"):
            (scratch / sub).mkdir(parents=True)
        signed = f" [signed-by={keyring}]" if keyring else ""
        (scratch / "sources.list").write_text(f"deb{signed} {mirror.uri} {DEBIAN_SUITE} main\n")
        apt = ["apt-get", "-q", "-o", f"Dir::Etc::SourceList={scratch / 'sources.list'}",
               "-o", f"Dir::Etc::SourceParts={scratch / 'sources.list.d'}",
               "-o", f"Dir::State::Lists={scratch / 'lists'}", "-o", f"Dir::Cache={scratch / 'cache'}",
               "-o", "Dir::Etc::Preferences=/dev/null",
               "-o", f"Dir::Etc::PreferencesParts={scratch / 'sources.list.d'}",
               "-o", "APT::Sandbox::User=root", "-o", "Acquire::Retries=3", "-o", "Acquire::Languages=none"]
        log(f"ort_headers: apt-get update ({DEBIAN_SUITE} main from the machine's Debian mirror, private lists)")
        _run(apt + ["update"], "apt-get update (private trixie list)")
        log(f"ort_headers: apt-get download {DEBIAN_PACKAGE}")
        _run(apt + ["download", DEBIAN_PACKAGE], f"apt-get download {DEBIAN_PACKAGE}", cwd=scratch / "download")
        debs = sorted((scratch / "download").glob("*.deb"))
        if len(debs) != 1:
            raise HeadersUnavailable(f"apt-get download {DEBIAN_PACKAGE} left {len(debs)} .deb files")
        unpacked = scratch / "unpacked"
        _run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], f"dpkg-deb -x {debs[0].name}")
        include = header_dir(unpacked / "usr")
        if include is None:
            raise HeadersUnavailable(f"{debs[0].name} holds no {HEADER}")
        (unpacked / "SOURCE").write_text(f"{debs[0].name}\n")
        if cache.exists():
            shutil.rmtree(cache)
        unpacked.rename(cache)  # same file system: the cache appears complete or not at all
    include = header_dir(cache / "usr")
    log(f"ort_headers: {include / HEADER} (ORT_API_VERSION {api_version(include)}, from "
        f"{(cache / 'SOURCE').read_text().strip()})")
    return include


def ensure(log=print) -> Path:
    """The include folder: found (ONNXRUNTIME_ROOT, cache) or fetched. Raises HeadersUnavailable with the reason."""
    include = find() or fetch(log=log)
    version = api_version(include)
    if version is None or version < MIN_API_VERSION:
        raise HeadersUnavailable(f"{include / HEADER}: ORT_API_VERSION {version}, need >= {MIN_API_VERSION}")
    return include


def main() -> int:
    try:
        print(ensure())
    except HeadersUnavailable as exc:
        print(f"error: ONNX Runtime C API header unavailable: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

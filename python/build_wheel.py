#!/usr/bin/env python3
"""Builds the stableflash wheel from this folder's package and a built libstableflash_c.so, with the
standard library only (no build backend, no network, no torch): a wheel is a zip with a
.dist-info folder. Tag py3-none-linux_x86_64: the package is pure Python over a C ABI loaded by
ctypes, so it fits any CPython 3 on x86-64 Linux; not manylinux, as the library is built against
this machine's glibc and CUDA 13 runtime (docs/python.md says what the GPU machine needs).

    python3 python/build_wheel.py --lib build-cuda/capi/libstableflash_c.so --out build-cuda/wheel
"""
import argparse
import base64
import hashlib
import os
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME, TAG = "stableflash", "py3-none-linux_x86_64"


def version():
    for line in open(os.path.join(HERE, NAME, "__init__.py")):
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip('"')
    sys.exit("no __version__ in stableflash/__init__.py")


def record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="the built libstableflash_c.so")
    p.add_argument("--out", required=True, help="folder for the .whl")
    p.add_argument("--with-lib", action="append", default=[],
                   help="a shared library to put beside it (found through its $ORIGIN run path)")
    a = p.parse_args()
    if not os.path.isfile(a.lib):
        sys.exit(f"--lib {a.lib}: no such file (build it: ninja -C build-cuda stableflash_c)")
    ver = version()
    dist_info = f"{NAME}-{ver}.dist-info"
    files = []  # (arcname, bytes)
    for root, dirs, names in os.walk(os.path.join(HERE, NAME)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py"):
                path = os.path.join(root, n)
                files.append((os.path.relpath(path, HERE), open(path, "rb").read()))
    files.append((f"{NAME}/_lib/libstableflash_c.so", open(a.lib, "rb").read()))
    for extra in a.with_lib:
        files.append((f"{NAME}/_lib/{os.path.basename(extra)}", open(extra, "rb").read()))
    metadata = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {ver}\n"
                "Summary: BF16 flash attention with a stabilized softmax, as a PyTorch op (needs PyTorch with CUDA 13)\n"
                "Requires-Python: >=3.9\n")
    # No Requires-Dist on torch: `pip install --no-index --target DIR` must not try to resolve it
    # (it is already there, and pip --target does not see site-packages).
    files.append((f"{dist_info}/METADATA", metadata.encode()))
    files.append((f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: stableflash build_wheel.py\n"
                                        f"Root-Is-Purelib: false\nTag: {TAG}\n".encode()))
    files.append((f"{dist_info}/top_level.txt", f"{NAME}\n".encode()))
    record = "\n".join(record_line(n, d) for n, d in files) + f"\n{dist_info}/RECORD,,\n"
    os.makedirs(a.out, exist_ok=True)
    wheel = os.path.join(a.out, f"{NAME}-{ver}-{TAG}.whl")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))  # fixed: the same inputs give the same wheel
            info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
        z.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record)
    print(wheel)


if __name__ == "__main__":
    main()

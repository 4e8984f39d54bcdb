#!/usr/bin/env python3
"""Compiles the CUDA kernels with NVRTC for sm_90 on a machine without a GPU (this development VM),
the way the engine does at run time (`crates/tensorzip-cuda/src/compile.rs`: `kernels/smem.cuh` in
front, `--std=c++17 -lineinfo`, each compile unit by its `TZ_UNIT` value), so that a kernel that
does not compile is found before a device call is spent on it. NVRTC comes from the
`nvidia-cuda-nvrtc` 13 wheel: the running interpreter's, or one installed into target/nvrtc-venv
on first use. scripts/test.sh runs it (CI has no GPU: this is where the kernels are compiled).

    scripts/nvrtc_check.py                  every unit of every kernel source
    scripts/nvrtc_check.py FILE.cu [UNIT]   one source (a variant, e.g. for TENSORZIP_DEV_*_SRC)

Prints each unit's cubin size and compile time; exits non-zero on the first compile error (its log
printed). With TZ_CUBIN_DIR=DIR set, each unit's cubin is also written to DIR/NAME.UNIT.cubin (for
`nvdisasm -g -c`, from the nvidia-cuda-nvdisasm wheel: the SASS without a device call)."""
import concurrent.futures
import ctypes
import glob
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "crates/tensorzip-cuda/kernels")
VENV = os.path.join(ROOT, "target/nvrtc-venv")
# Units per source: -1 the common kernels, 0.. one per variant (plan::KERNELS: 7,
# encode::VARIANTS: 7); the search has one unit.
UNITS = {"decode.cu": range(-1, 7), "encode.cu": range(-1, 8), "search.cu": [-1]}


def _site_libs(root, pattern):
    return sorted(glob.glob(os.path.join(root, pattern)))


def nvrtc():
    # NVRTC 13 first: the engine is built for CUDA 13 (cudarc's `cuda-13000`) and the device
    # compiles with NVRTC 13, so a kernel that only NVRTC 13 refuses must fail here too. The
    # `nvidia-cuda-nvrtc` 13 wheel (scripts/test.sh installs it; torch's CUDA 13 build depends on
    # it) puts it in nvidia/cu13/lib; NVRTC 12's wheel (nvidia/cuda_nvrtc/lib) is the fallback.
    libs = []
    try:
        import nvidia  # noqa: F401  (a namespace package: its path is what we need)

        for d in nvidia.__path__:
            libs += _site_libs(d, "cu13/lib/libnvrtc.so.13*")
        for d in nvidia.__path__:
            libs += _site_libs(d, "cuda_nvrtc/lib/libnvrtc.so.*")
    except ImportError:
        pass
    if not libs:
        libs = _site_libs(VENV, "lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13*")
    if not libs:
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([os.path.join(VENV, "bin/pip"), "install", "-q", "nvidia-cuda-nvrtc==13.*"], check=True)
        libs = _site_libs(VENV, "lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13*")
    libs = [l for l in libs if "alt" not in os.path.basename(l) and "builtins" not in os.path.basename(l)]
    lib = ctypes.CDLL(libs[0])
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value} ({libs[0]})", flush=True)
    return lib


def compile_unit(lib, name, src, unit):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=sm_90", b"--std=c++17", b"-lineinfo", f"-DTZ_UNIT={unit}".encode()]
    t = time.time()
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    took = time.time() - t
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    cubin = ctypes.c_size_t()
    if rc == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin))
        out_dir = os.environ.get("TZ_CUBIN_DIR")
        if out_dir:
            # The cubin itself, for reading the SASS here (`nvdisasm -g -c FILE`; nvdisasm comes
            # from the nvidia-cuda-nvdisasm wheel).
            buf = ctypes.create_string_buffer(cubin.value)
            lib.nvrtcGetCUBIN(prog, buf)
            with open(os.path.join(out_dir, f"{os.path.splitext(name)[0]}.{unit}.cubin"), "wb") as f:
                f.write(buf.raw)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace"), cubin.value, took


def main():
    lib = nvrtc()
    smem = open(os.path.join(KERNELS, "smem.cuh")).read()
    if len(sys.argv) > 1:
        path = sys.argv[1]
        units = [int(sys.argv[2])] if len(sys.argv) > 2 else UNITS.get(os.path.basename(path), [-1])
        todo = [(path, units)]
    else:
        todo = [(os.path.join(KERNELS, f), u) for f, u in UNITS.items()]
    work = [(path, smem + open(path).read(), unit) for path, units in todo for unit in units]
    # One NVRTC program per unit, on every core (ctypes lets go of the GIL during the compile);
    # reported in order.
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        done = pool.map(lambda w: compile_unit(lib, os.path.basename(w[0]), w[1], w[2]), work)
        for (path, _, unit), (rc, log, size, took) in zip(work, done):
            if rc != 0:
                print(f"{path} unit {unit}: compile failed\n{log}")
                sys.exit(1)
            print(f"{os.path.basename(path)} unit {unit:2}: cubin {size:8} bytes, {took:5.1f} s")


if __name__ == "__main__":
    main()

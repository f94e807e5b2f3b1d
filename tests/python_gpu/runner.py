"""A plain test runner for the GPU machine (no pytest there): @test registers a function, run()
calls each, prints one line per test and `N passed, N failed, N skipped`, and returns the exit
code (1 on any failure). A test skips by raising Skip with the reason.

--quick (scripts/device-check-python.sh --quick) runs only the tests marked @quick, and
quick_mode() tells a test to take its smaller configuration."""
import sys
import time
import traceback

TESTS = []
_quick = False


class Skip(Exception):
    pass


def test(fn):
    TESTS.append(fn)
    return fn


def quick(fn):
    """Marks a test as part of the quick mode (put it above or below @test)."""
    fn.quick = True
    return fn


def quick_mode():
    return _quick


def run(selected=None, quick_only=False):
    passed = failed = skipped = 0
    for t in TESTS:
        if selected and not any(s in t.__name__ for s in selected):
            continue
        if quick_only and not getattr(t, "quick", False):
            continue
        t0 = time.time()
        try:
            t()
            passed += 1
            print(f"ok       {t.__name__} ({time.time() - t0:.1f} s)", flush=True)
        except Skip as e:
            skipped += 1
            print(f"SKIPPED  {t.__name__}: {e}", flush=True)
        except Exception as e:  # every test runs; the run fails at the end
            failed += 1
            print(f"FAILED   {t.__name__}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=4)
    print(f"{passed} passed, {failed} failed, {skipped} skipped{' (quick)' if quick_only else ''}")
    return 1 if failed else 0


def main():
    global _quick
    args = sys.argv[1:]
    if "--quick" in args:
        args.remove("--quick")
        _quick = True
    sys.exit(run(args, quick_only=_quick))

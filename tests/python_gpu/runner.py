"""A plain test runner for the GPU machine (no pytest there): @test registers a function, run()
calls each, prints one line per test and `N passed, N failed, N skipped`, and returns the exit
code (1 on any failure). A test skips by raising Skip with the reason."""
import sys
import time
import traceback

TESTS = []


class Skip(Exception):
    pass


def test(fn):
    TESTS.append(fn)
    return fn


def run(selected=None):
    passed = failed = skipped = 0
    for t in TESTS:
        if selected and not any(s in t.__name__ for s in selected):
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
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def main():
    sys.exit(run(sys.argv[1:]))

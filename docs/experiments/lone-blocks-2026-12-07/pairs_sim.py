#!/usr/bin/env python3
# python3 pairs_sim.py: a model of the warp-specialized forward's barrier protocol with paired lone blocks (kLonePairs):
# producer, three consumers (128 threads each = one arrival unit), mbarrier phases, named-barrier turns.
# Random interleavings; fails on a deadlock, an over-arrival, or a row block computed wrongly.
import random

PROGRESS = [0]  # state changes so far: a long run of picks without one is a deadlock

class Bar:
    def __init__(s, expected): s.n, s.pending, s.expected = 0, 0, expected
    def arrive(s, units=1):
        PROGRESS[0] += 1
        s.pending += units
        assert s.pending <= s.expected, "over-arrival"
        if s.pending == s.expected: s.n += 1; s.pending = 0
    def done(s, parity): return (s.n & 1) != parity

def run(heads, blocks64, steps, seed, pairs=True):
    C, STAGES = 3, 2
    rng = random.Random(seed)
    slots = STAGES * (2 if pairs else 1)
    q = [Bar(1) for _ in range(C)]; q_empty = [Bar(1) for _ in range(C)]
    k_full = [Bar(1) for _ in range(slots)]; v_full = [Bar(1) for _ in range(slots)]
    k_empty = [Bar(C if s < STAGES else 1) for s in range(slots)]; v_empty = [Bar(C if s < STAGES else 1) for s in range(slots)]
    turns = [0] * C; turns[0] = 1
    blocks = (blocks64 + C - 1) // C
    assert blocks64 % C == 1
    # schedule (WsTileOrder::at with kLonePairs)
    sched = []
    whole = (blocks - 1) * heads
    for t in range(whole): sched.append(dict(m0=t % (blocks - 1) * 3, h=t // (blocks - 1), items=0, pair=-1))
    for i in range((heads + 1) // 2):
        bh = 2 * i; sched.append(dict(m0=(blocks - 1) * 3, h=bh, items=1, pair=bh + 1 if bh + 1 < heads else -1))
    shared = {}
    computed = []  # (head, block) per consumer walk

    def load_step(s, use):  # K then V of one step into slot s, each once the slot's last use is handed back
        for empty, full in ((k_empty, k_full), (v_empty, v_full)):
            if use > 0:
                while not empty[s].done((use - 1) & 1): yield
            full[s].arrive(); yield

    def producer():
        ring, ring_b = 0, 0
        for r, tile in enumerate(sched + [None]):
            if r > 0:
                for c in range(C):
                    while not q_empty[c].done((r - 1) & 1): yield
            if tile is None:
                shared['end'] = True
                for c in range(C): q[c].arrive()
                return
            paired = tile['pair'] >= 0
            rows = []
            for c in range(C):
                if paired and c == 1: rows.append((tile['pair'], tile['m0']))
                elif tile['items'] == 0 or c < tile['items']: rows.append((tile['h'], tile['m0'] + c))
                else: rows.append(None)
            shared[r] = dict(rows=rows, slot0=[STAGES if paired and c == 1 else 0 for c in range(C)],
                             arrivals=[2 if paired and c == C - 1 else 1 for c in range(C)], total=steps)
            for c in range(C): q[c].arrive(); yield
            for j in range(steps):
                yield from load_step(ring % STAGES, ring // STAGES)
                ring += 1
                if paired:
                    yield from load_step(STAGES + ring_b % STAGES, ring_b // STAGES)
                    ring_b += 1

    def consumer(c):
        first, first_b = 0, 0
        r = 0
        while True:
            while not q[c].done(r & 1): yield
            if shared.get('end') and r not in shared: return
            rec = shared[r]; total = rec['total']; mine = rec['rows'][c]
            slot0 = rec['slot0'][c]; covers = rec['arrivals'][c] == 2
            base = first
            if slot0: base = first_b
            own = total if mine is not None else 0
            stage = lambda j: slot0 + (base + j) % STAGES
            phase = lambda j: ((base + j) // STAGES) & 1
            for j in range(own):
                while not k_full[stage(j)].done(phase(j)): yield
                while turns[c] == 0: yield
                turns[c] -= 1
                if j > 0:
                    while not v_full[stage(j - 1)].done(phase(j - 1)): yield
                turns[(c + 1) % C] += 1; yield
                k_empty[stage(j)].arrive(); yield
                if j == own - 1: q_empty[c].arrive()
                if j > 0: v_empty[stage(j - 1)].arrive(); yield
            if own > 0:
                while not v_full[stage(own - 1)].done(phase(own - 1)): yield
                v_empty[stage(own - 1)].arrive()
                computed.append(mine)
            else:
                q_empty[c].arrive()
            if slot0: first_b += total
            stageA = lambda j: (first + j) % STAGES
            phaseA = lambda j: ((first + j) // STAGES) & 1
            for j in range(own, total):
                while not k_full[stageA(j)].done(phaseA(j)): yield
                while turns[c] == 0: yield
                turns[c] -= 1; turns[(c + 1) % C] += 1; yield
                k_empty[stageA(j)].arrive(2 if covers else 1); yield
                while not v_full[stageA(j)].done(phaseA(j)): yield
                v_empty[stageA(j)].arrive(2 if covers else 1); yield
            first += total
            r += 1

    agents = [producer()] + [consumer(c) for c in range(C)]
    alive = list(range(len(agents)))
    last_turns = list(turns)
    last, idle = PROGRESS[0], 0
    while alive:
        i = rng.choice(alive)
        try:
            next(agents[i])
        except StopIteration:
            alive.remove(i)
        idle = 0 if PROGRESS[0] != last or turns != last_turns else idle + 1
        last, last_turns = PROGRESS[0], list(turns)
        if idle > 20000: raise RuntimeError(f"deadlock: {heads} heads, {blocks64} blocks, {steps} steps, seed {seed}")
    want = sorted((h, b) for h in range(heads) for b in range(blocks64))
    assert sorted(computed) == want, (sorted(computed)[:10], len(computed), len(want))

if __name__ == "__main__":
    n = 0
    for heads in (1, 2, 3, 4, 5):
        for blocks64 in (1, 4, 7):
            for steps in (1, 2, 3, 5):
                for seed in range(20):
                    run(heads, blocks64, steps, seed); n += 1
    print("ok", n, "interleavings")

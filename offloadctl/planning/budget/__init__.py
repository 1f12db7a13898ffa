"""The budget strategy: choose what to offload so the peak device memory fits a budget.

Where the distance strategy (HyperOffload) offloads every gap longer than ``select_distance``, the
budget strategy chooses individual *intervals* — the gaps of an activation between consecutive
producer/use positions, and the idle stretches of a weight (before its first use, between uses,
after its last use) — so that the peak fits ``budget_bytes`` at the least cost.

The cost (``objective``, see `offloadctl.simulation.costs`) is a price per copy: the bytes moved (every byte
crosses the host link; with copies in line on the compute stream every byte is time the model
waits), or the estimated time the copy adds under the copy mode (``copies``): in line, ``latency +
bytes / bandwidth`` of its direction from a device profile; on streams (not yet timed on a device),
what the compute in the copy's window does not hide. Offloading a
tensor at all costs its *opening* copies (an activation's D2H, plus the H2D feeding it back as a
graph output; a weight's first H2D), and each further interval one H2D. The number of offloads, by
contrast, says nothing: one large tensor costs more than ten small ones. On streams an H2D is priced
as issued ``prefetch_distance`` before its use, and an activation's D2H by the compute up to its
release point, which its first offloaded gap decides: the greedy prices each move from the current
state, pruning prices each removal the same way, and no bound is recorded (the cost is not a sum of
per-copy prices). With the time objective, the plan the bytes objective finds at the same budget is
estimated too and the faster of the two kept (``budget.compared``), so asking for time never gives
a longer estimated time than asking for bytes.

Memory follows `offloadctl.analysis.timeline` (the simulator's rules, stated once there). With prefetch
distance 0 and release distance 0, an interval frees exactly its idle steps, so the search works
on *intervals*: each one a set of steps it frees, its bytes and its cost.

Greedy search (the default), built to scale to graphs of 100,000 nodes:

1. Candidates are what ``select`` accepts at select distance 0 (so ``--never``, unknown sizes,
   host-side inputs, weights that are graph outputs, ``--min-bytes`` are all respected).
   ``--force`` tensors start offloaded (their largest gap) and stay offloaded.
2. While the peak exceeds the budget, look at the peak step. Every interval that would free it is
   scored by the reduction of over-budget memory it brings, summed over all steps (each step
   capped at its excess), per unit of cost. The best is taken together with the intervals that
   score exactly as well, as many as the peak step still needs: the largest that fit in what is
   left, then the smallest that completes it (one round moves many equally good weights at once,
   few and large ones rather than many small ones). Scores are computed for all intervals at once
   from prefix sums of the capped excess (one per distinct tensor size) over the over-budget steps
   only; the memory profile is a `timeline.WorkingSet` (add an interval, find the peak: O(sqrt(steps))).
3. Pruning: every chosen interval whose removal keeps the peak within the budget is dropped, the
   most expensive first (a removal only raises memory, so an interval that cannot go now never can).
4. Prefetch: every reload is first placed at its use (distance 0). Then, in execution order, each
   offload gets the largest per-tensor ``prefetch_distance`` <= the requested global distance that
   keeps the peak within the budget. With copies on streams it gets only the lead its H2Ds need to
   be done in time on the shared link (scheduled back from their deadlines, one copy at a time per
   direction; `offloadctl.planning.budget.search.Planner.place_prefetch_streams`), within the same
   limits: a longer lead would hold memory and take the link ahead of copies due sooner.

The plan's ``budget`` object records what the plan costs and a proven lower bound on what any plan
of this strategy must cost (for each of the steps furthest over the budget: the cheapest way to
free its excess, taking intervals fractionally; with release distance 0, where an interval frees
exactly its idle steps), and the gap between them.

Exact search (``optimal=True``, needs HiGHS; linear costs only: bytes, or time with copies in line):
the same choice written as an integer covering program (`offloadctl.planning.budget.optimal`),
started from the greedy's plan, with a time limit; it returns the best plan found, HiGHS's proven
bound and the gap. Every answer is checked against the timeline in exact integer bytes before it
is trusted; one that does not fit, or costs more than the greedy's, is set aside for the greedy's.

If the budget is below the lower bound (the largest single-node working set: inputs, outputs and
weights one node reads), or cannot be reached, a `BudgetUnreachable` error gives the lower bound and
the best peak reachable. `BudgetSearch` prepares what does not depend on the budget once, for
sweeps over many budgets (`offloadctl.planning.tradeoff`). When the user did not enable weights
(``--params``) and activations alone cannot reach the budget, weights are added as candidates and
the plan says so.

Weight streaming (``stream_weights``): weights stay on the host and come in by *layer group*.
Groups are built from the execution order: eligible weights sorted by first use are packed into
consecutive groups of at most the size of the largest single node's weights (so a group never has
to be larger than what one node needs anyway; for a transformer this gives roughly the attention
projections, the MLP up and the MLP down of each layer). Group k is copied in at the start of group
k - depth's window and each weight is freed after its last use, so at most depth + 1 groups are on
the device. A weight also read outside its group's window (shared across layers) stays resident.
Streamed weights are fixed choices; with a budget they start loaded at their first use, the search
handles the rest, and prefetch placement then gives each streamed weight the longest lead, up to
its group's depth, that keeps the budget.

A model with dynamic input dimensions is refused until they are pinned (``--input-shape``); other
tensors of unknown size count 0 bytes.

Rooms: `candidates` (candidate tensors, their states, the intervals, the spans and prices of a
state, and their plan entries), `search` (the greedy, pruning, prefetch placement and the cost
bound, on a `Planner`), `solve` (one search start to end, over a planner), `exact` and `optimal`
(the exact search, its covering program, HiGHS in a child process), `streaming` (weight streaming
by layer group), `prepared` (what does not depend on the budget, done once), `build` (the plan one
search makes and its ``budget`` object) and `strategy` (the entry points: `BudgetSearch`,
`budget_plan`, `budget_filter`).
"""

-- notifyq schema, version 25: the looks beside every claim and every completion read indexes,
-- never the whole of notifyq.jobs, whatever the table looked like when they were planned.
--
-- next_due_v3 (the look for the next run_at, in every look_and_claim statement of a worker) and
-- anything_follows_v1 (in every completion: complete_v3, complete_and_claim_v2) are plpgsql
-- with plan_cache_mode = force_generic_plan: each connection plans them once, at its first
-- call, and keeps the plan until notifyq.jobs is next analyzed or vacuumed. On a new database
-- the table has never been vacuumed, and the planner's guess of ten pages for such a table does
-- not apply to one with children (jobs_done inherits it); after a vacuum of a drained queue it
-- is empty. Either way a sequential scan looked cheapest: two in next_due_v3 (deferred jobs,
-- suspended jobs), one in anything_follows_v1. A sequential scan reads every row version in
-- the heap, and behind a pinned xmin horizon every job leaves two there that nothing can
-- remove: at 1,000 jobs a second each look read about 30 pages more every second, until
-- autovacuum happened to analyze the table (a one-minute run beside an open REPEATABLE READ
-- transaction: the pickup's p99 went from 17 to 74 ms, the look from 0.4 to 16 ms a call).
--
-- As the claim and the completion themselves do (claim_v4, write_completions_v1), these two now
-- plan without sequential scans: next_due_v3 reads the partial indexes jobs_deferred_idx and
-- jobs_suspended_idx, anything_follows_v1 the GIN index jobs_dependents_idx (whose only way is
-- a bitmap scan, so bitmap scans stay allowed). The setting goes on the functions, not their
-- callers: a cached plan is the one made by whichever caller came first.
ALTER FUNCTION notifyq.next_due_v3(text[], text[]) SET enable_seqscan = off;
ALTER FUNCTION notifyq.anything_follows_v1(uuid[], text[]) SET enable_seqscan = off;

-- Version 23's enqueues and task registration, kept beside version 24's so that its workers and
-- APIs ran through a rolling upgrade: no code of version 24 or later calls them. Stop processes
-- of version 23 before this version (docs/upgrading/025.md).
DROP FUNCTION notifyq.enqueue_many_v5(text[], jsonb[], text[], integer[], timestamptz[],
                                      float8[], text[], integer[], integer, text[], text[],
                                      uuid[], uuid[], jsonb, text[]);
DROP FUNCTION notifyq.enqueue_many_v4(text[], jsonb[], text[], integer[], timestamptz[],
                                      float8[], text[], integer[], integer, text[], text[],
                                      uuid[], uuid[], jsonb);
DROP FUNCTION notifyq.register_task_v1(text, integer, jsonb, integer, float8, integer, float8,
                                       float8);

-- Schedules declared in code (ADRs/0015): the scheduler reads the next due tick of the live ones.
CREATE INDEX ix_agent_schedule_due ON agent_schedule (next_tick_at)
    WHERE NOT paused AND removed_at IS NULL;

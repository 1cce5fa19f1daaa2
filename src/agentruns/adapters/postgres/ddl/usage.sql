-- The usage ledger's index (ADRs/0033): a workspace's spend over a period reads its rows in
-- time order, whatever its runs' number.
CREATE INDEX ix_agent_usage_workspace_at ON agent_usage (workspace, at);
-- The console's spend of every workspace in a window (today) reads the window's rows alone.
CREATE INDEX ix_agent_usage_at ON agent_usage (at);

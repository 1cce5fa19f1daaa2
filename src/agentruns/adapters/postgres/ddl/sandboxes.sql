-- A sandbox's row owns its claim (ADRs/0008). The state table and the identity are kept by
-- guard_agent_sandbox; the order of its times by the table's CHECK constraints.

-- One live sandbox per (workspace, subject).
CREATE UNIQUE INDEX uq_agent_sandbox_live_subject ON agent_sandbox (workspace, subject)
    WHERE state IN ('requested', 'ready');
CREATE INDEX ix_agent_sandbox_deleting ON agent_sandbox (requested_at)
    WHERE state = 'deleting';

-- A first call is recorded once, and the last use never moves back.
CREATE FUNCTION guard_agent_sandbox() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'requested' THEN
            RAISE EXCEPTION 'agent_sandbox %: a sandbox is inserted requested, not %',
                NEW.id, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
            OR NEW.workspace IS DISTINCT FROM OLD.workspace
            OR NEW.subject IS DISTINCT FROM OLD.subject
            OR NEW.claim_name IS DISTINCT FROM OLD.claim_name
            OR NEW.conversation IS DISTINCT FROM OLD.conversation
            OR NEW.requested_at IS DISTINCT FROM OLD.requested_at
            OR NEW.shutdown_at IS DISTINCT FROM OLD.shutdown_at THEN
        RAISE EXCEPTION 'agent_sandbox %: a sandbox never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    IF NOT ((OLD.state = 'requested' AND NEW.state IN ('requested', 'ready', 'deleting'))
            OR (OLD.state = 'ready' AND NEW.state IN ('ready', 'deleting'))) THEN
        RAISE EXCEPTION 'agent_sandbox %: illegal transition % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox';
    END IF;
    IF (OLD.ready_at IS NOT NULL AND NEW.ready_at IS DISTINCT FROM OLD.ready_at)
            OR (OLD.last_used_at IS NOT NULL
                AND (NEW.last_used_at IS NULL OR NEW.last_used_at < OLD.last_used_at)) THEN
        RAISE EXCEPTION 'agent_sandbox %: its first call is kept and its last use never moves '
            'back', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox_times';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER guard_agent_sandbox BEFORE INSERT OR UPDATE ON agent_sandbox
    FOR EACH ROW EXECUTE FUNCTION guard_agent_sandbox();

-- A live sandbox's row is its claim's owner: it is deleted only once it is being deleted (the
-- reaper's last step), so the row never goes while its Pod may still run. The condition keeps
-- the reaper's own delete from calling the function.
CREATE FUNCTION refuse_agent_sandbox_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'agent_sandbox %: only a deleting sandbox is deleted, not a % one', OLD.id,
        OLD.state
        USING ERRCODE = 'check_violation', CONSTRAINT = 'guard_agent_sandbox_delete';
END
$$;

CREATE TRIGGER guard_agent_sandbox_delete BEFORE DELETE ON agent_sandbox
    FOR EACH ROW WHEN (OLD.state <> 'deleting') EXECUTE FUNCTION refuse_agent_sandbox_delete();

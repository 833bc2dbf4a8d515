-- add_agent
INSERT INTO agents (name, owner_user_id, model, system_prompt, max_rounds, max_tokens_per_day, allowed_tools, policy_mode, compact_max_ctx, destructive_policy) VALUES ($1::VARCHAR, $2::VARCHAR, $3::VARCHAR, $4::VARCHAR, $5::INTEGER, $6::INTEGER, $7::TEXT[], $8::VARCHAR, $9::INTEGER, $10::VARCHAR) RETURNING agents.id, agents.name, agents.owner_user_id, agents.model, agents.system_prompt, agents.max_rounds, agents.max_tokens_per_day, agents.allowed_tools, agents.created_at, agents.policy_mode, agents.compact_max_ctx, agents.destructive_policy;

-- add_mission
INSERT INTO missions (agent_id, objective, cron, timezone, next_run_at, deadline, catch_up, catch_up_window) VALUES ($1::BIGINT, $2::VARCHAR, $3::VARCHAR, $4::VARCHAR, $5::TIMESTAMP WITH TIME ZONE, $6::TIMESTAMP WITH TIME ZONE, $7::VARCHAR, $8::INTERVAL) RETURNING missions.id, missions.agent_id, missions.objective, missions.cron, missions.timezone, missions.status, missions.next_run_at, missions.lease_owner, missions.lease_expires_at, missions.deadline, missions.last_error, missions.created_at, missions.updated_at, missions.catch_up, missions.catch_up_window;

-- get_iteration
SELECT approval_requests.id, approval_requests.consumer, approval_requests.user_id, approval_requests.agent_id, approval_requests.mission_id, approval_requests.iteration_id, approval_requests.attempt, approval_requests.round, approval_requests.position, approval_requests.call_id, approval_requests.tool, approval_requests.arguments, approval_requests.arguments_hash, approval_requests.reply_text, approval_requests.reason, approval_requests.mcp_token_id, approval_requests.created_at, approval_requests.expires_at, approval_requests.decided_by, approval_requests.decided_at, approval_requests.decision_note, approval_requests.used_at, approval_requests.target, CASE WHEN (approval_requests.status = $1::VARCHAR AND approval_requests.expires_at <= now()) THEN $2::VARCHAR ELSE approval_requests.status END AS status 
FROM approval_requests 
WHERE approval_requests.iteration_id = $3::BIGINT ORDER BY approval_requests.id;

-- get_iteration
SELECT compacted_turns.id, compacted_turns.iteration_id, compacted_turns.mission_id, compacted_turns.attempt, compacted_turns.compaction_index, compacted_turns.round, compacted_turns.start_index, compacted_turns.folded, compacted_turns.folded_turns, compacted_turns.summary, compacted_turns.tokens_before, compacted_turns.tokens_after, compacted_turns.model, compacted_turns.duration_ms, compacted_turns.error, compacted_turns.created_at 
FROM compacted_turns 
WHERE compacted_turns.iteration_id = $1::BIGINT ORDER BY compacted_turns.compaction_index;

-- get_iteration
SELECT mission_iterations.id, mission_iterations.mission_id, mission_iterations.scheduled_for, mission_iterations.status, mission_iterations.attempt, mission_iterations.messages, mission_iterations.reminders, mission_iterations.attempts, mission_iterations.rounds, mission_iterations.prompt_tokens, mission_iterations.completion_tokens, mission_iterations.stop_reason, mission_iterations.error, mission_iterations.worker_id, mission_iterations.model, mission_iterations.started_at, mission_iterations.finished_at 
FROM mission_iterations 
WHERE mission_iterations.id = $1::BIGINT;

-- get_iteration
SELECT tool_invocations.id, tool_invocations.iteration_id, tool_invocations.mission_id, tool_invocations.user_id, tool_invocations.attempt, tool_invocations.round, tool_invocations.position, tool_invocations.call_id, tool_invocations.tool, tool_invocations.arguments, tool_invocations.result, tool_invocations.error, tool_invocations.outcome, tool_invocations.policy_decision, tool_invocations.policy_mode, tool_invocations.idempotency_key, tool_invocations.duration_ms, tool_invocations.created_at, tool_invocations.consumer, tool_invocations.mcp_token_id 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = $1::BIGINT ORDER BY tool_invocations.attempt, tool_invocations.round, tool_invocations.position, tool_invocations.id;

-- mission_history
SELECT compacted_turns.id, compacted_turns.iteration_id, compacted_turns.mission_id, compacted_turns.attempt, compacted_turns.compaction_index, compacted_turns.round, compacted_turns.start_index, compacted_turns.folded_turns, compacted_turns.summary, compacted_turns.tokens_before, compacted_turns.tokens_after, compacted_turns.model, compacted_turns.duration_ms, compacted_turns.error, compacted_turns.created_at 
FROM compacted_turns 
WHERE compacted_turns.iteration_id IN ($1::BIGINT) ORDER BY compacted_turns.iteration_id, compacted_turns.compaction_index;

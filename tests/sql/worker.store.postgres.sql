-- claim_due
WITH due AS 
(SELECT missions.id AS id 
FROM missions 
WHERE missions.status = 'active' AND missions.next_run_at <= now() AND (missions.lease_expires_at IS NULL OR missions.lease_expires_at < now()) AND (missions.deadline IS NOT NULL AND now() > missions.deadline OR NOT (EXISTS (SELECT approval_requests.id 
FROM approval_requests 
WHERE approval_requests.mission_id = missions.id AND approval_requests.status = 'pending' AND approval_requests.expires_at > now()))) ORDER BY missions.next_run_at 
 LIMIT 4 FOR UPDATE SKIP LOCKED), 
claimed AS 
(UPDATE missions SET lease_owner=$1::VARCHAR, lease_expires_at=(now() + $2::INTERVAL), updated_at=now() FROM due, agents WHERE missions.id = due.id AND agents.id = missions.agent_id RETURNING missions.id, missions.objective, missions.cron, missions.timezone, missions.next_run_at, missions.deadline, agents.id AS agent_id, agents.name AS agent_name, agents.owner_user_id, agents.model, agents.system_prompt, agents.max_rounds, agents.max_tokens_per_day, agents.allowed_tools, agents.policy_mode, agents.destructive_policy, agents.compact_max_ctx, (SELECT jsonb_build_object('destructive_opt_ins', user_policy_settings.destructive_opt_ins, 'rate_limit', user_policy_settings.rate_limit, 'tool_rate_limits', user_policy_settings.tool_rate_limits) AS jsonb_build_object_1 
FROM user_policy_settings 
WHERE user_policy_settings.user_id = agents.owner_user_id) AS owner_policy, (SELECT jsonb_agg(jsonb_build_object('name', agent_mcp_servers.name, 'transport', agent_mcp_servers.transport, 'url', agent_mcp_servers.url, 'command', agent_mcp_servers.command, 'args', agent_mcp_servers.args, 'headers', agent_mcp_servers.headers, 'env', agent_mcp_servers.env, 'required', agent_mcp_servers.required) ORDER BY agent_mcp_servers.name) AS jsonb_agg_1 
FROM agent_mcp_servers 
WHERE agent_mcp_servers.agent_id = agents.id) AS mcp_servers, CASE WHEN (agents.max_tokens_per_day IS NULL) THEN NULL ELSE (SELECT coalesce(sum(budget_iterations.prompt_tokens + budget_iterations.completion_tokens), 0) AS coalesce_1 
FROM mission_iterations AS budget_iterations JOIN missions AS budget_missions ON budget_missions.id = budget_iterations.mission_id 
WHERE budget_missions.agent_id = agents.id AND budget_iterations.started_at >= now() - $3::INTERVAL AND (budget_iterations.mission_id != missions.id OR budget_iterations.scheduled_for != missions.next_run_at)) END AS tokens_used_24h, missions.deadline IS NOT NULL AND now() > missions.deadline AS past_deadline, missions.catch_up, missions.catch_up_window, (missions.catch_up = 'skip' AND missions.next_run_at < now() - interval '60 seconds' OR missions.catch_up = 'all' AND missions.next_run_at < now() - coalesce(missions.catch_up_window, interval '86400 seconds')) AND NOT (EXISTS (SELECT mission_iterations.id 
FROM mission_iterations 
WHERE mission_iterations.mission_id = missions.id AND mission_iterations.scheduled_for = missions.next_run_at)) AS missed, now() AS claimed_at), 
started AS 
(INSERT INTO mission_iterations (mission_id, scheduled_for, status, worker_id, model, attempts) SELECT claimed.id AS id, claimed.next_run_at AS next_run_at, 'running', $1::VARCHAR AS anon_1, coalesce(claimed.model, $4::VARCHAR) AS coalesce_2, jsonb_build_array(jsonb_build_object('attempt', 1, 'worker_id', $1::VARCHAR, 'started_at', now())) AS jsonb_build_array_1 
FROM claimed 
WHERE NOT claimed.past_deadline AND NOT claimed.missed ON CONFLICT (mission_id, scheduled_for) DO UPDATE SET status = 'running', attempt = (mission_iterations.attempt + 1), attempts = (mission_iterations.attempts || jsonb_build_array(jsonb_build_object('attempt', mission_iterations.attempt + 1, 'worker_id', excluded.worker_id, 'started_at', now(), 'resumed_after_round', mission_iterations.rounds, 'resumed_from', mission_iterations.status))), stop_reason = NULL, error = NULL, worker_id = excluded.worker_id, model = excluded.model, started_at = now(), finished_at = NULL WHERE mission_iterations.status IN ('running', 'awaiting_approval') OR mission_iterations.status = 'failed' AND mission_iterations.stop_reason = 'interrupted' RETURNING mission_iterations.id, mission_iterations.mission_id, mission_iterations.attempt, mission_iterations.messages, mission_iterations.rounds, mission_iterations.prompt_tokens, mission_iterations.completion_tokens, mission_iterations.reminders)
 SELECT claimed.id, claimed.objective, claimed.cron, claimed.timezone, claimed.next_run_at, claimed.deadline, claimed.agent_id, claimed.agent_name, claimed.owner_user_id, claimed.model, claimed.system_prompt, claimed.max_rounds, claimed.max_tokens_per_day, claimed.allowed_tools, claimed.policy_mode, claimed.destructive_policy, claimed.compact_max_ctx, claimed.owner_policy, claimed.mcp_servers, claimed.tokens_used_24h, claimed.past_deadline, claimed.catch_up, claimed.catch_up_window, claimed.missed, claimed.claimed_at, started.id AS iteration_id, started.attempt, started.messages, started.rounds, started.prompt_tokens, started.completion_tokens, started.reminders 
FROM claimed LEFT OUTER JOIN started ON started.mission_id = claimed.id;

-- commit_round
WITH owned AS 
(SELECT missions.id AS id 
FROM missions 
WHERE missions.id = $1::BIGINT AND missions.lease_owner = $2::VARCHAR), 
write_0 AS 
(UPDATE mission_iterations SET messages=coalesce($3::JSONB, mission_iterations.messages), reminders=coalesce($4::JSONB, mission_iterations.reminders), rounds=coalesce($5::INTEGER, mission_iterations.rounds), prompt_tokens=coalesce($6::BIGINT, mission_iterations.prompt_tokens), completion_tokens=coalesce($7::BIGINT, mission_iterations.completion_tokens) WHERE mission_iterations.id = $8::BIGINT AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING mission_iterations.id), 
given_calls AS 
(SELECT p_new_calls.iteration_id AS iteration_id, p_new_calls.mission_id AS mission_id, p_new_calls.user_id AS user_id, p_new_calls.round AS round, p_new_calls.position AS position, p_new_calls.call_id AS call_id, p_new_calls.tool AS tool, p_new_calls.arguments AS arguments, p_new_calls.idempotency_key AS idempotency_key, p_new_calls.attempt AS attempt, p_new_calls.result AS result, p_new_calls.error AS error, p_new_calls.outcome AS outcome, p_new_calls.policy_decision AS policy_decision, p_new_calls.policy_mode AS policy_mode, p_new_calls.duration_ms AS duration_ms, (SELECT tool_invocations.id 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = p_new_calls.iteration_id AND tool_invocations.attempt = p_new_calls.attempt AND tool_invocations.round = p_new_calls.round AND tool_invocations.position = p_new_calls.position 
 LIMIT 1) AS stored_id 
FROM jsonb_to_recordset($9::JSONB) AS p_new_calls(iteration_id BIGINT, mission_id BIGINT, user_id TEXT, round INTEGER, position INTEGER, call_id TEXT, tool TEXT, arguments JSONB, idempotency_key TEXT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION)), 
write_1 AS 
(INSERT INTO tool_invocations (iteration_id, mission_id, user_id, round, position, call_id, tool, arguments, idempotency_key, attempt, result, error, outcome, policy_decision, policy_mode, duration_ms) SELECT given_calls.iteration_id AS iteration_id, given_calls.mission_id AS mission_id, given_calls.user_id AS user_id, given_calls.round AS round, given_calls.position AS position, given_calls.call_id AS call_id, given_calls.tool AS tool, given_calls.arguments AS arguments, given_calls.idempotency_key AS idempotency_key, given_calls.attempt AS attempt, given_calls.result AS result, given_calls.error AS error, given_calls.outcome AS outcome, given_calls.policy_decision AS policy_decision, given_calls.policy_mode AS policy_mode, given_calls.duration_ms AS duration_ms 
FROM given_calls 
WHERE (EXISTS (SELECT owned.id 
FROM owned)) AND given_calls.stored_id IS NULL ORDER BY given_calls.round, given_calls.position RETURNING tool_invocations.round, tool_invocations.position, tool_invocations.id), 
write_2 AS 
(UPDATE tool_invocations SET attempt=CASE WHEN (tool_invocations.outcome = 'parked') THEN p_known_calls.attempt ELSE tool_invocations.attempt END, result=p_known_calls.result, error=p_known_calls.error, outcome=p_known_calls.outcome, policy_decision=p_known_calls.policy_decision, policy_mode=p_known_calls.policy_mode, duration_ms=p_known_calls.duration_ms FROM jsonb_to_recordset($10::JSONB) AS p_known_calls(id BIGINT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION) WHERE tool_invocations.id = p_known_calls.id AND tool_invocations.id = ANY (array((SELECT p_known_calls.id 
FROM jsonb_to_recordset($10::JSONB) AS p_known_calls(id BIGINT)))) AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING tool_invocations.id), 
write_3 AS 
(INSERT INTO compacted_turns (iteration_id, mission_id, attempt, compaction_index, round, start_index, folded, folded_turns, summary, tokens_before, tokens_after, model, duration_ms, error) SELECT p_archive.iteration_id AS iteration_id, p_archive.mission_id AS mission_id, p_archive.attempt AS attempt, p_archive.compaction_index AS compaction_index, p_archive.round AS round, p_archive.start_index AS start_index, p_archive.folded AS folded, p_archive.folded_turns AS folded_turns, p_archive.summary AS summary, p_archive.tokens_before AS tokens_before, p_archive.tokens_after AS tokens_after, p_archive.model AS model, p_archive.duration_ms AS duration_ms, p_archive.error AS error 
FROM jsonb_to_recordset($11::JSONB) AS p_archive(iteration_id BIGINT, mission_id BIGINT, attempt INTEGER, compaction_index INTEGER, round INTEGER, start_index INTEGER, folded JSONB, folded_turns INTEGER, summary TEXT, tokens_before INTEGER, tokens_after INTEGER, model TEXT, duration_ms DOUBLE PRECISION, error TEXT) 
WHERE EXISTS (SELECT owned.id 
FROM owned) ON CONFLICT (iteration_id, compaction_index) DO NOTHING RETURNING compacted_turns.id)
 SELECT (SELECT count(*) AS count_1 
FROM owned) AS owned, (SELECT coalesce(jsonb_agg(jsonb_build_array(call_ids.round, call_ids.position, call_ids.id)), '[]'::jsonb) AS coalesce_1 
FROM (SELECT write_1.round AS round, write_1.position AS position, write_1.id AS id 
FROM write_1 UNION ALL SELECT given_calls.round AS round, given_calls.position AS position, given_calls.stored_id AS stored_id 
FROM given_calls 
WHERE given_calls.stored_id IS NOT NULL AND (EXISTS (SELECT owned.id 
FROM owned))) AS call_ids) AS calls;

-- end_run
WITH owned AS 
(UPDATE missions SET lease_owner=NULL, lease_expires_at=NULL, updated_at=now() WHERE missions.id = $1::BIGINT AND missions.lease_owner = $2::VARCHAR RETURNING missions.id), 
write_0 AS 
(UPDATE mission_iterations SET status=$3::VARCHAR, messages=coalesce($4::JSONB, mission_iterations.messages), reminders=coalesce($5::JSONB, mission_iterations.reminders), rounds=coalesce($6::INTEGER, mission_iterations.rounds), prompt_tokens=coalesce($7::BIGINT, mission_iterations.prompt_tokens), completion_tokens=coalesce($8::BIGINT, mission_iterations.completion_tokens), stop_reason=$9::VARCHAR, error=$10::VARCHAR, finished_at=now() WHERE mission_iterations.id = $11::BIGINT AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING mission_iterations.id), 
given_calls AS 
(SELECT p_new_calls.iteration_id AS iteration_id, p_new_calls.mission_id AS mission_id, p_new_calls.user_id AS user_id, p_new_calls.round AS round, p_new_calls.position AS position, p_new_calls.call_id AS call_id, p_new_calls.tool AS tool, p_new_calls.arguments AS arguments, p_new_calls.idempotency_key AS idempotency_key, p_new_calls.attempt AS attempt, p_new_calls.result AS result, p_new_calls.error AS error, p_new_calls.outcome AS outcome, p_new_calls.policy_decision AS policy_decision, p_new_calls.policy_mode AS policy_mode, p_new_calls.duration_ms AS duration_ms, (SELECT tool_invocations.id 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = p_new_calls.iteration_id AND tool_invocations.attempt = p_new_calls.attempt AND tool_invocations.round = p_new_calls.round AND tool_invocations.position = p_new_calls.position 
 LIMIT 1) AS stored_id 
FROM jsonb_to_recordset($12::JSONB) AS p_new_calls(iteration_id BIGINT, mission_id BIGINT, user_id TEXT, round INTEGER, position INTEGER, call_id TEXT, tool TEXT, arguments JSONB, idempotency_key TEXT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION)), 
write_1 AS 
(INSERT INTO tool_invocations (iteration_id, mission_id, user_id, round, position, call_id, tool, arguments, idempotency_key, attempt, result, error, outcome, policy_decision, policy_mode, duration_ms) SELECT given_calls.iteration_id AS iteration_id, given_calls.mission_id AS mission_id, given_calls.user_id AS user_id, given_calls.round AS round, given_calls.position AS position, given_calls.call_id AS call_id, given_calls.tool AS tool, given_calls.arguments AS arguments, given_calls.idempotency_key AS idempotency_key, given_calls.attempt AS attempt, given_calls.result AS result, given_calls.error AS error, given_calls.outcome AS outcome, given_calls.policy_decision AS policy_decision, given_calls.policy_mode AS policy_mode, given_calls.duration_ms AS duration_ms 
FROM given_calls 
WHERE (EXISTS (SELECT owned.id 
FROM owned)) AND given_calls.stored_id IS NULL ORDER BY given_calls.round, given_calls.position RETURNING tool_invocations.round, tool_invocations.position, tool_invocations.id), 
write_2 AS 
(UPDATE tool_invocations SET attempt=CASE WHEN (tool_invocations.outcome = 'parked') THEN p_known_calls.attempt ELSE tool_invocations.attempt END, result=p_known_calls.result, error=p_known_calls.error, outcome=p_known_calls.outcome, policy_decision=p_known_calls.policy_decision, policy_mode=p_known_calls.policy_mode, duration_ms=p_known_calls.duration_ms FROM jsonb_to_recordset($13::JSONB) AS p_known_calls(id BIGINT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION) WHERE tool_invocations.id = p_known_calls.id AND tool_invocations.id = ANY (array((SELECT p_known_calls.id 
FROM jsonb_to_recordset($13::JSONB) AS p_known_calls(id BIGINT)))) AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING tool_invocations.id), 
write_3 AS 
(INSERT INTO compacted_turns (iteration_id, mission_id, attempt, compaction_index, round, start_index, folded, folded_turns, summary, tokens_before, tokens_after, model, duration_ms, error) SELECT p_archive.iteration_id AS iteration_id, p_archive.mission_id AS mission_id, p_archive.attempt AS attempt, p_archive.compaction_index AS compaction_index, p_archive.round AS round, p_archive.start_index AS start_index, p_archive.folded AS folded, p_archive.folded_turns AS folded_turns, p_archive.summary AS summary, p_archive.tokens_before AS tokens_before, p_archive.tokens_after AS tokens_after, p_archive.model AS model, p_archive.duration_ms AS duration_ms, p_archive.error AS error 
FROM jsonb_to_recordset($14::JSONB) AS p_archive(iteration_id BIGINT, mission_id BIGINT, attempt INTEGER, compaction_index INTEGER, round INTEGER, start_index INTEGER, folded JSONB, folded_turns INTEGER, summary TEXT, tokens_before INTEGER, tokens_after INTEGER, model TEXT, duration_ms DOUBLE PRECISION, error TEXT) 
WHERE EXISTS (SELECT owned.id 
FROM owned) ON CONFLICT (iteration_id, compaction_index) DO NOTHING RETURNING compacted_turns.id), 
write_4 AS 
(INSERT INTO approval_requests (consumer, user_id, agent_id, mission_id, iteration_id, attempt, round, position, call_id, tool, arguments, arguments_hash, reply_text, reason, target, expires_at) SELECT $15::VARCHAR AS anon_1, $16::VARCHAR AS anon_2, $17::BIGINT AS anon_3, $1::BIGINT AS anon_4, $11::BIGINT AS anon_5, $18::INTEGER AS anon_6, $19::INTEGER AS anon_7, $20::INTEGER AS anon_8, $21::VARCHAR AS anon_9, $22::VARCHAR AS anon_10, $23::JSONB AS anon_11, $24::VARCHAR AS anon_12, $25::VARCHAR AS anon_13, $26::VARCHAR AS anon_14, $27::VARCHAR AS anon_15, now() + $28::INTERVAL AS anon_16 
WHERE EXISTS (SELECT owned.id 
FROM owned) ON CONFLICT (iteration_id, round, position) WHERE consumer = 'mission' DO NOTHING RETURNING approval_requests.id, approval_requests.expires_at)
 SELECT (SELECT count(*) AS count_1 
FROM owned) AS owned, EXISTS (SELECT * 
FROM mission_iterations 
WHERE mission_iterations.id = $11::BIGINT AND mission_iterations.attempt = $18::INTEGER AND mission_iterations.worker_id = $2::VARCHAR AND mission_iterations.status = $3::VARCHAR AND mission_iterations.finished_at IS NOT NULL) AS stored, (SELECT coalesce(jsonb_agg(jsonb_build_array(call_ids.round, call_ids.position, call_ids.id)), '[]'::jsonb) AS coalesce_1 
FROM (SELECT write_1.round AS round, write_1.position AS position, write_1.id AS id 
FROM write_1 UNION ALL SELECT given_calls.round AS round, given_calls.position AS position, given_calls.stored_id AS stored_id 
FROM given_calls 
WHERE given_calls.stored_id IS NOT NULL AND (EXISTS (SELECT owned.id 
FROM owned))) AS call_ids) AS calls, coalesce((SELECT write_4.id 
FROM write_4), (SELECT found_request.id 
FROM (SELECT approval_requests.id AS id, approval_requests.expires_at AS expires_at, approval_requests.attempt AS attempt 
FROM approval_requests 
WHERE approval_requests.consumer = 'mission' AND approval_requests.iteration_id = $11::BIGINT AND approval_requests.round = $19::INTEGER AND approval_requests.position = $20::INTEGER) AS found_request)) AS approval_id, (EXISTS (SELECT write_4.id 
FROM write_4)) OR (EXISTS (SELECT found_request.id 
FROM (SELECT approval_requests.id AS id, approval_requests.expires_at AS expires_at, approval_requests.attempt AS attempt 
FROM approval_requests 
WHERE approval_requests.consumer = 'mission' AND approval_requests.iteration_id = $11::BIGINT AND approval_requests.round = $19::INTEGER AND approval_requests.position = $20::INTEGER) AS found_request 
WHERE found_request.attempt = $18::INTEGER)) AS approval_created, coalesce((SELECT write_4.expires_at 
FROM write_4), (SELECT found_request.expires_at 
FROM (SELECT approval_requests.id AS id, approval_requests.expires_at AS expires_at, approval_requests.attempt AS attempt 
FROM approval_requests 
WHERE approval_requests.consumer = 'mission' AND approval_requests.iteration_id = $11::BIGINT AND approval_requests.round = $19::INTEGER AND approval_requests.position = $20::INTEGER) AS found_request)) AS approval_expires_at;

-- end_run
WITH owned AS 
(UPDATE missions SET status=CASE WHEN (missions.status = 'paused') THEN 'paused' ELSE $1::VARCHAR END, next_run_at=$2::TIMESTAMP WITH TIME ZONE, lease_owner=NULL, lease_expires_at=NULL, last_error=$3::VARCHAR, updated_at=now() WHERE missions.id = $4::BIGINT AND missions.lease_owner = $5::VARCHAR RETURNING missions.id), 
write_0 AS 
(UPDATE mission_iterations SET status=$6::VARCHAR, messages=coalesce($7::JSONB, mission_iterations.messages), reminders=coalesce($8::JSONB, mission_iterations.reminders), rounds=coalesce($9::INTEGER, mission_iterations.rounds), prompt_tokens=coalesce($10::BIGINT, mission_iterations.prompt_tokens), completion_tokens=coalesce($11::BIGINT, mission_iterations.completion_tokens), stop_reason=$12::VARCHAR, error=$13::VARCHAR, finished_at=now() WHERE mission_iterations.id = $14::BIGINT AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING mission_iterations.id), 
given_calls AS 
(SELECT p_new_calls.iteration_id AS iteration_id, p_new_calls.mission_id AS mission_id, p_new_calls.user_id AS user_id, p_new_calls.round AS round, p_new_calls.position AS position, p_new_calls.call_id AS call_id, p_new_calls.tool AS tool, p_new_calls.arguments AS arguments, p_new_calls.idempotency_key AS idempotency_key, p_new_calls.attempt AS attempt, p_new_calls.result AS result, p_new_calls.error AS error, p_new_calls.outcome AS outcome, p_new_calls.policy_decision AS policy_decision, p_new_calls.policy_mode AS policy_mode, p_new_calls.duration_ms AS duration_ms, (SELECT tool_invocations.id 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = p_new_calls.iteration_id AND tool_invocations.attempt = p_new_calls.attempt AND tool_invocations.round = p_new_calls.round AND tool_invocations.position = p_new_calls.position 
 LIMIT 1) AS stored_id 
FROM jsonb_to_recordset($15::JSONB) AS p_new_calls(iteration_id BIGINT, mission_id BIGINT, user_id TEXT, round INTEGER, position INTEGER, call_id TEXT, tool TEXT, arguments JSONB, idempotency_key TEXT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION)), 
write_1 AS 
(INSERT INTO tool_invocations (iteration_id, mission_id, user_id, round, position, call_id, tool, arguments, idempotency_key, attempt, result, error, outcome, policy_decision, policy_mode, duration_ms) SELECT given_calls.iteration_id AS iteration_id, given_calls.mission_id AS mission_id, given_calls.user_id AS user_id, given_calls.round AS round, given_calls.position AS position, given_calls.call_id AS call_id, given_calls.tool AS tool, given_calls.arguments AS arguments, given_calls.idempotency_key AS idempotency_key, given_calls.attempt AS attempt, given_calls.result AS result, given_calls.error AS error, given_calls.outcome AS outcome, given_calls.policy_decision AS policy_decision, given_calls.policy_mode AS policy_mode, given_calls.duration_ms AS duration_ms 
FROM given_calls 
WHERE (EXISTS (SELECT owned.id 
FROM owned)) AND given_calls.stored_id IS NULL ORDER BY given_calls.round, given_calls.position RETURNING tool_invocations.round, tool_invocations.position, tool_invocations.id), 
write_2 AS 
(UPDATE tool_invocations SET attempt=CASE WHEN (tool_invocations.outcome = 'parked') THEN p_known_calls.attempt ELSE tool_invocations.attempt END, result=p_known_calls.result, error=p_known_calls.error, outcome=p_known_calls.outcome, policy_decision=p_known_calls.policy_decision, policy_mode=p_known_calls.policy_mode, duration_ms=p_known_calls.duration_ms FROM jsonb_to_recordset($16::JSONB) AS p_known_calls(id BIGINT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION) WHERE tool_invocations.id = p_known_calls.id AND tool_invocations.id = ANY (array((SELECT p_known_calls.id 
FROM jsonb_to_recordset($16::JSONB) AS p_known_calls(id BIGINT)))) AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING tool_invocations.id), 
write_3 AS 
(INSERT INTO compacted_turns (iteration_id, mission_id, attempt, compaction_index, round, start_index, folded, folded_turns, summary, tokens_before, tokens_after, model, duration_ms, error) SELECT p_archive.iteration_id AS iteration_id, p_archive.mission_id AS mission_id, p_archive.attempt AS attempt, p_archive.compaction_index AS compaction_index, p_archive.round AS round, p_archive.start_index AS start_index, p_archive.folded AS folded, p_archive.folded_turns AS folded_turns, p_archive.summary AS summary, p_archive.tokens_before AS tokens_before, p_archive.tokens_after AS tokens_after, p_archive.model AS model, p_archive.duration_ms AS duration_ms, p_archive.error AS error 
FROM jsonb_to_recordset($17::JSONB) AS p_archive(iteration_id BIGINT, mission_id BIGINT, attempt INTEGER, compaction_index INTEGER, round INTEGER, start_index INTEGER, folded JSONB, folded_turns INTEGER, summary TEXT, tokens_before INTEGER, tokens_after INTEGER, model TEXT, duration_ms DOUBLE PRECISION, error TEXT) 
WHERE EXISTS (SELECT owned.id 
FROM owned) ON CONFLICT (iteration_id, compaction_index) DO NOTHING RETURNING compacted_turns.id)
 SELECT (SELECT count(*) AS count_1 
FROM owned) AS owned, EXISTS (SELECT * 
FROM mission_iterations 
WHERE mission_iterations.id = $14::BIGINT AND mission_iterations.attempt = $18::INTEGER AND mission_iterations.worker_id = $5::VARCHAR AND mission_iterations.status = $6::VARCHAR AND mission_iterations.finished_at IS NOT NULL) AS stored, (SELECT coalesce(jsonb_agg(jsonb_build_array(call_ids.round, call_ids.position, call_ids.id)), '[]'::jsonb) AS coalesce_1 
FROM (SELECT write_1.round AS round, write_1.position AS position, write_1.id AS id 
FROM write_1 UNION ALL SELECT given_calls.round AS round, given_calls.position AS position, given_calls.stored_id AS stored_id 
FROM given_calls 
WHERE given_calls.stored_id IS NOT NULL AND (EXISTS (SELECT owned.id 
FROM owned))) AS call_ids) AS calls;

-- record_call_start
WITH reservation AS 
(SELECT reserved, checked_at, recent 
FROM mana_ai_reserve_tool_call($1::VARCHAR, $2::VARCHAR, $3::VARCHAR, $4::INTERVAL, $5::INTEGER)), 
owned AS 
(SELECT missions.id AS id 
FROM missions 
WHERE missions.id = $6::BIGINT AND missions.lease_owner = $7::VARCHAR), 
write_0 AS 
(UPDATE mission_iterations SET messages=coalesce($8::JSONB, mission_iterations.messages), reminders=coalesce($9::JSONB, mission_iterations.reminders), rounds=coalesce($10::INTEGER, mission_iterations.rounds), prompt_tokens=coalesce($11::BIGINT, mission_iterations.prompt_tokens), completion_tokens=coalesce($12::BIGINT, mission_iterations.completion_tokens) WHERE mission_iterations.id = $13::BIGINT AND (EXISTS (SELECT owned.id 
FROM owned)) RETURNING mission_iterations.id), 
given_calls AS 
(SELECT p_new_calls.iteration_id AS iteration_id, p_new_calls.mission_id AS mission_id, p_new_calls.user_id AS user_id, p_new_calls.round AS round, p_new_calls.position AS position, p_new_calls.call_id AS call_id, p_new_calls.tool AS tool, p_new_calls.arguments AS arguments, p_new_calls.idempotency_key AS idempotency_key, p_new_calls.attempt AS attempt, p_new_calls.result AS result, p_new_calls.error AS error, p_new_calls.outcome AS outcome, p_new_calls.policy_decision AS policy_decision, p_new_calls.policy_mode AS policy_mode, p_new_calls.duration_ms AS duration_ms, (SELECT tool_invocations.id 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = p_new_calls.iteration_id AND tool_invocations.attempt = p_new_calls.attempt AND tool_invocations.round = p_new_calls.round AND tool_invocations.position = p_new_calls.position 
 LIMIT 1) AS stored_id 
FROM jsonb_to_recordset($14::JSONB) AS p_new_calls(iteration_id BIGINT, mission_id BIGINT, user_id TEXT, round INTEGER, position INTEGER, call_id TEXT, tool TEXT, arguments JSONB, idempotency_key TEXT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION)), 
write_1 AS 
(INSERT INTO tool_invocations (iteration_id, mission_id, user_id, round, position, call_id, tool, arguments, idempotency_key, attempt, result, error, outcome, policy_decision, policy_mode, duration_ms) SELECT given_calls.iteration_id AS iteration_id, given_calls.mission_id AS mission_id, given_calls.user_id AS user_id, given_calls.round AS round, given_calls.position AS position, given_calls.call_id AS call_id, given_calls.tool AS tool, given_calls.arguments AS arguments, given_calls.idempotency_key AS idempotency_key, given_calls.attempt AS attempt, given_calls.result AS result, given_calls.error AS error, given_calls.outcome AS outcome, given_calls.policy_decision AS policy_decision, given_calls.policy_mode AS policy_mode, given_calls.duration_ms AS duration_ms 
FROM given_calls 
WHERE (EXISTS (SELECT owned.id 
FROM owned)) AND given_calls.stored_id IS NULL AND (given_calls.outcome != 'started' OR (SELECT reservation.reserved 
FROM reservation) OR $15::BOOLEAN) ORDER BY given_calls.round, given_calls.position RETURNING tool_invocations.round, tool_invocations.position, tool_invocations.id), 
write_2 AS 
(UPDATE tool_invocations SET attempt=CASE WHEN (tool_invocations.outcome = 'parked') THEN p_known_calls.attempt ELSE tool_invocations.attempt END, result=p_known_calls.result, error=p_known_calls.error, outcome=p_known_calls.outcome, policy_decision=p_known_calls.policy_decision, policy_mode=p_known_calls.policy_mode, duration_ms=p_known_calls.duration_ms FROM jsonb_to_recordset($16::JSONB) AS p_known_calls(id BIGINT, attempt INTEGER, result JSONB, error TEXT, outcome TEXT, policy_decision JSONB, policy_mode TEXT, duration_ms DOUBLE PRECISION) WHERE tool_invocations.id = p_known_calls.id AND tool_invocations.id = ANY (array((SELECT p_known_calls.id 
FROM jsonb_to_recordset($16::JSONB) AS p_known_calls(id BIGINT)))) AND (EXISTS (SELECT owned.id 
FROM owned)) AND (p_known_calls.outcome != 'started' OR (SELECT reservation.reserved 
FROM reservation) OR $15::BOOLEAN) RETURNING tool_invocations.id), 
write_3 AS 
(INSERT INTO compacted_turns (iteration_id, mission_id, attempt, compaction_index, round, start_index, folded, folded_turns, summary, tokens_before, tokens_after, model, duration_ms, error) SELECT p_archive.iteration_id AS iteration_id, p_archive.mission_id AS mission_id, p_archive.attempt AS attempt, p_archive.compaction_index AS compaction_index, p_archive.round AS round, p_archive.start_index AS start_index, p_archive.folded AS folded, p_archive.folded_turns AS folded_turns, p_archive.summary AS summary, p_archive.tokens_before AS tokens_before, p_archive.tokens_after AS tokens_after, p_archive.model AS model, p_archive.duration_ms AS duration_ms, p_archive.error AS error 
FROM jsonb_to_recordset($17::JSONB) AS p_archive(iteration_id BIGINT, mission_id BIGINT, attempt INTEGER, compaction_index INTEGER, round INTEGER, start_index INTEGER, folded JSONB, folded_turns INTEGER, summary TEXT, tokens_before INTEGER, tokens_after INTEGER, model TEXT, duration_ms DOUBLE PRECISION, error TEXT) 
WHERE EXISTS (SELECT owned.id 
FROM owned) ON CONFLICT (iteration_id, compaction_index) DO NOTHING RETURNING compacted_turns.id)
 SELECT (SELECT count(*) AS count_1 
FROM owned) AS owned, (SELECT reservation.reserved 
FROM reservation) AS reserved, (SELECT reservation.checked_at 
FROM reservation) AS checked_at, (SELECT reservation.recent 
FROM reservation) AS recent, (SELECT coalesce(jsonb_agg(jsonb_build_array(call_ids.round, call_ids.position, call_ids.id)), '[]'::jsonb) AS coalesce_1 
FROM (SELECT write_1.round AS round, write_1.position AS position, write_1.id AS id 
FROM write_1 UNION ALL SELECT given_calls.round AS round, given_calls.position AS position, given_calls.stored_id AS stored_id 
FROM given_calls 
WHERE given_calls.stored_id IS NOT NULL AND (EXISTS (SELECT owned.id 
FROM owned))) AS call_ids) AS calls;

-- resume_details
SELECT approval_requests.id, approval_requests.position, approval_requests.status, approval_requests.tool, approval_requests.arguments_hash, approval_requests.decided_by, approval_requests.decided_at, approval_requests.decision_note, approval_requests.target 
FROM approval_requests 
WHERE approval_requests.iteration_id = $1::BIGINT AND approval_requests.consumer = $2::VARCHAR AND approval_requests.round = $3::INTEGER ORDER BY approval_requests.position;

-- resume_details
SELECT compacted_turns.round, compacted_turns.tokens_after 
FROM compacted_turns 
WHERE compacted_turns.iteration_id = $1::BIGINT AND compacted_turns.error IS NULL ORDER BY compacted_turns.compaction_index DESC 
 LIMIT $2::INTEGER;

-- resume_details
SELECT count(*) AS count_1, count(*) FILTER (WHERE compacted_turns.error IS NULL) AS anon_1 
FROM compacted_turns 
WHERE compacted_turns.iteration_id = $1::BIGINT;

-- resume_details
SELECT tool_invocations.id, tool_invocations.position, tool_invocations.outcome, tool_invocations.result, tool_invocations.error, tool_invocations.policy_decision 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = $1::BIGINT AND tool_invocations.round = $2::INTEGER ORDER BY tool_invocations.id;

-- resume_details
UPDATE approval_requests SET status=$1::VARCHAR, decided_at=approval_requests.expires_at WHERE approval_requests.iteration_id = $2::BIGINT AND approval_requests.consumer = $3::VARCHAR AND approval_requests.status = $4::VARCHAR AND approval_requests.expires_at <= now();

-- run_effect
WITH held AS 
(SELECT missions.id AS id 
FROM missions 
WHERE missions.id = $6::BIGINT AND missions.lease_owner = $7::VARCHAR AND missions.lease_expires_at > now() FOR KEY SHARE)
 UPDATE tool_invocations SET result=$1::JSONB, error=$2::VARCHAR, outcome=$3::VARCHAR WHERE tool_invocations.id = $4::BIGINT AND tool_invocations.outcome = $5::VARCHAR AND (EXISTS (SELECT held.id 
FROM held)) RETURNING tool_invocations.id;

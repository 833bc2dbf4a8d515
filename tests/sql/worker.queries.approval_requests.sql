-- decide
SELECT approval_requests.id, approval_requests.consumer, approval_requests.status, approval_requests.user_id, approval_requests.agent_id, approval_requests.mission_id, approval_requests.iteration_id, approval_requests.attempt, approval_requests.round, approval_requests.position, approval_requests.call_id, approval_requests.tool, approval_requests.arguments, approval_requests.arguments_hash, approval_requests.reply_text, approval_requests.reason, approval_requests.mcp_token_id, approval_requests.created_at, approval_requests.expires_at, approval_requests.decided_by, approval_requests.decided_at, approval_requests.decision_note, approval_requests.used_at, approval_requests.target, approval_requests.expires_at <= now() AS lapsed 
FROM approval_requests 
WHERE approval_requests.id = $1::BIGINT FOR UPDATE;

-- decide
SELECT approval_requests.id, approval_requests.consumer, approval_requests.user_id, approval_requests.agent_id, approval_requests.mission_id, approval_requests.iteration_id, approval_requests.attempt, approval_requests.round, approval_requests.position, approval_requests.call_id, approval_requests.tool, approval_requests.arguments, approval_requests.arguments_hash, approval_requests.reply_text, approval_requests.reason, approval_requests.mcp_token_id, approval_requests.created_at, approval_requests.expires_at, approval_requests.decided_by, approval_requests.decided_at, approval_requests.decision_note, approval_requests.used_at, approval_requests.target, CASE WHEN (approval_requests.status = $1::VARCHAR AND approval_requests.expires_at <= now()) THEN $2::VARCHAR ELSE approval_requests.status END AS status, agents.name AS agent, mission_iterations.status AS iteration_status, missions.status AS mission_status, missions.objective AS objective, latest_call.outcome AS call_outcome, latest_call.reason AS call_reason 
FROM approval_requests LEFT OUTER JOIN agents ON agents.id = approval_requests.agent_id LEFT OUTER JOIN mission_iterations ON mission_iterations.id = approval_requests.iteration_id LEFT OUTER JOIN missions ON missions.id = approval_requests.mission_id LEFT OUTER JOIN LATERAL (SELECT tool_invocations.outcome AS outcome, tool_invocations.policy_decision ->> $3::TEXT AS reason 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = approval_requests.iteration_id AND tool_invocations.round = approval_requests.round AND tool_invocations.position = approval_requests.position ORDER BY tool_invocations.id DESC 
 LIMIT $4::INTEGER) AS latest_call ON true 
WHERE approval_requests.id = $5::BIGINT;

-- decide
SELECT mission_iterations.status, missions.id AS mission, missions.deadline < now() AS past_deadline 
FROM mission_iterations LEFT OUTER JOIN missions ON missions.id = mission_iterations.mission_id 
WHERE mission_iterations.id = $1::BIGINT;

-- decide
SELECT pg_notify($1::VARCHAR, $2::VARCHAR) AS pg_notify_1;

-- decide
UPDATE approval_requests SET status=$1::VARCHAR, decided_by=$2::VARCHAR, decided_at=now(), decision_note=$3::VARCHAR WHERE approval_requests.id = $4::BIGINT AND approval_requests.status = $5::VARCHAR;

-- list_requests
SELECT approval_requests.id, approval_requests.consumer, approval_requests.user_id, approval_requests.agent_id, approval_requests.mission_id, approval_requests.iteration_id, approval_requests.attempt, approval_requests.round, approval_requests.position, approval_requests.call_id, approval_requests.tool, approval_requests.arguments, approval_requests.arguments_hash, approval_requests.reply_text, approval_requests.reason, approval_requests.mcp_token_id, approval_requests.created_at, approval_requests.expires_at, approval_requests.decided_by, approval_requests.decided_at, approval_requests.decision_note, approval_requests.used_at, approval_requests.target, CASE WHEN (approval_requests.status = $1::VARCHAR AND approval_requests.expires_at <= now()) THEN $2::VARCHAR ELSE approval_requests.status END AS status, agents.name AS agent, mission_iterations.status AS iteration_status, missions.status AS mission_status, missions.objective AS objective, latest_call.outcome AS call_outcome, latest_call.reason AS call_reason 
FROM approval_requests LEFT OUTER JOIN agents ON agents.id = approval_requests.agent_id LEFT OUTER JOIN mission_iterations ON mission_iterations.id = approval_requests.iteration_id LEFT OUTER JOIN missions ON missions.id = approval_requests.mission_id LEFT OUTER JOIN LATERAL (SELECT tool_invocations.outcome AS outcome, tool_invocations.policy_decision ->> $3::TEXT AS reason 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = approval_requests.iteration_id AND tool_invocations.round = approval_requests.round AND tool_invocations.position = approval_requests.position ORDER BY tool_invocations.id DESC 
 LIMIT $4::INTEGER) AS latest_call ON true ORDER BY approval_requests.id DESC 
 LIMIT $5::INTEGER;

-- of_iteration
SELECT approval_requests.id, approval_requests.consumer, approval_requests.user_id, approval_requests.agent_id, approval_requests.mission_id, approval_requests.iteration_id, approval_requests.attempt, approval_requests.round, approval_requests.position, approval_requests.call_id, approval_requests.tool, approval_requests.arguments, approval_requests.arguments_hash, approval_requests.reply_text, approval_requests.reason, approval_requests.mcp_token_id, approval_requests.created_at, approval_requests.expires_at, approval_requests.decided_by, approval_requests.decided_at, approval_requests.decision_note, approval_requests.used_at, approval_requests.target, CASE WHEN (approval_requests.status = $1::VARCHAR AND approval_requests.expires_at <= now()) THEN $2::VARCHAR ELSE approval_requests.status END AS status, agents.name AS agent, mission_iterations.status AS iteration_status, missions.status AS mission_status, missions.objective AS objective, latest_call.outcome AS call_outcome, latest_call.reason AS call_reason 
FROM approval_requests LEFT OUTER JOIN agents ON agents.id = approval_requests.agent_id LEFT OUTER JOIN mission_iterations ON mission_iterations.id = approval_requests.iteration_id LEFT OUTER JOIN missions ON missions.id = approval_requests.mission_id LEFT OUTER JOIN LATERAL (SELECT tool_invocations.outcome AS outcome, tool_invocations.policy_decision ->> $3::TEXT AS reason 
FROM tool_invocations 
WHERE tool_invocations.iteration_id = approval_requests.iteration_id AND tool_invocations.round = approval_requests.round AND tool_invocations.position = approval_requests.position ORDER BY tool_invocations.id DESC 
 LIMIT $4::INTEGER) AS latest_call ON true 
WHERE approval_requests.iteration_id = $5::BIGINT ORDER BY approval_requests.id;

-- stats
SELECT count(*) FILTER (WHERE approval_requests.status = $1::VARCHAR) AS anon_1, count(*) FILTER (WHERE approval_requests.status = $2::VARCHAR) AS anon_2, count(*) FILTER (WHERE approval_requests.status = $3::VARCHAR OR approval_requests.status = $4::VARCHAR AND approval_requests.expires_at <= now()) AS anon_3, count(*) FILTER (WHERE approval_requests.status = $5::VARCHAR AND approval_requests.expires_at > now()) AS anon_4, coalesce(EXTRACT(epoch FROM now() - (min(approval_requests.created_at) FILTER (WHERE approval_requests.status = $5::VARCHAR AND approval_requests.expires_at > now()))), $6::INTEGER) AS coalesce_1 
FROM approval_requests;

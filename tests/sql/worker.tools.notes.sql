-- note_target
SELECT notes.title, char_length(notes.body) AS size, notes.updated_at, left(md5(concat_ws($1::VARCHAR, notes.title, notes.body, notes.updated_at)), $2::INTEGER) AS version 
FROM notes 
WHERE notes.id = $3::BIGINT AND notes.user_id = $4::VARCHAR;

-- notes_create
INSERT INTO notes (user_id, title, body, idempotency_key) VALUES ($1::VARCHAR, $2::VARCHAR, $3::VARCHAR, $4::VARCHAR) ON CONFLICT (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING notes.id, notes.title, notes.created_at, notes.updated_at;

-- notes_delete
DELETE FROM notes WHERE notes.id = $1::BIGINT AND notes.user_id = $2::VARCHAR RETURNING notes.id, notes.title;

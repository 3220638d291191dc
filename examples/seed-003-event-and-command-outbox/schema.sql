-- Seed 003: two outbox tables with different shapes in one database.
CREATE TABLE event_outbox (
  id SERIAL PRIMARY KEY,
  aggregate_type VARCHAR(255) NOT NULL,
  aggregate_id UUID NOT NULL,
  event_type VARCHAR(255) NOT NULL,
  payload JSONB NOT NULL,
  correlation_ids JSONB,
  created_at TIMESTAMP DEFAULT NOW(),
  published_at TIMESTAMP NULL,
  retry_count INT DEFAULT 0,
  last_error TEXT NULL
);
CREATE TABLE command_outbox (
  id SERIAL PRIMARY KEY,
  command_type VARCHAR(255) NOT NULL,
  payload JSONB NOT NULL,
  correlation_ids JSONB,
  created_at TIMESTAMP DEFAULT NOW(),
  published_at TIMESTAMP NULL,
  retry_count INT DEFAULT 0,
  last_error TEXT NULL
);

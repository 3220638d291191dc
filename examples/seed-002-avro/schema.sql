-- Seed 002: Prisma's OutboxEvent in schema tenant, camelCase columns (no
-- @map), CUID string ids, an enum status column.
CREATE SCHEMA tenant;
CREATE TYPE tenant."OutboxStatus" AS ENUM ('pending', 'published', 'failed');
CREATE TABLE tenant."OutboxEvent" (
  id text PRIMARY KEY,
  "tenantId" text NOT NULL,
  "eventType" text NOT NULL,
  "aggregateType" text NOT NULL,
  "aggregateId" text NOT NULL,
  payload jsonb NOT NULL,
  status tenant."OutboxStatus" NOT NULL DEFAULT 'pending',
  "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
  "publishedAt" timestamp(3)
);

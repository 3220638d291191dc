{{/* The release's full name: the release's, unless it lacks the chart's. */}}
{{- define "outbox-cdc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The pipeline's name: the metrics' pipeline label. */}}
{{- define "outbox-cdc.pipeline" -}}
{{- default .Release.Name .Values.pipelineName -}}
{{- end -}}

{{- define "outbox-cdc.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-cdc.labels" -}}
{{ include "outbox-cdc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
outbox-cdc/pipeline: {{ include "outbox-cdc.pipeline" . }}
{{- end -}}

{{- define "outbox-cdc.serviceAccount" -}}
{{- default (include "outbox-cdc.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/*
The files the Secrets are mounted as, under /etc/cdc/secrets: one entry per
Secret set in the values, with the config key that reads it.
*/}}
{{- define "outbox-cdc.secretFiles" -}}
{{- $files := list -}}
{{- with .Values.postgres.passwordSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "postgres-password") }}{{ end }}{{ end -}}
{{- with .Values.kafka.sasl.passwordSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "kafka-sasl-password") }}{{ end }}{{ end -}}
{{- with .Values.kafka.sasl.tokenSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "kafka-sasl-token") }}{{ end }}{{ end -}}
{{- with .Values.schemaRegistry.passwordSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "schema-registry-password") }}{{ end }}{{ end -}}
{{- with .Values.schemaRegistry.tokenSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "schema-registry-token") }}{{ end }}{{ end -}}
{{- with .Values.checkpoint.signingKeySecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "signing-key") }}{{ end }}{{ end -}}
{{- with .Values.metrics.tokenSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "metrics-token") }}{{ end }}{{ end -}}
{{- toJson $files -}}
{{- end -}}

{{/* The TLS files, under /etc/cdc/tls. */}}
{{- define "outbox-cdc.tlsFiles" -}}
{{- $files := list -}}
{{- with .Values.postgres.caSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "postgres-ca.crt") }}{{ end }}{{ end -}}
{{- with .Values.kafka.tls.caSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "kafka-ca.crt") }}{{ end }}{{ end -}}
{{- with .Values.schemaRegistry.caSecret }}{{ if .name }}{{ $files = append $files (dict "secret" .name "key" .key "file" "schema-registry-ca.crt") }}{{ end }}{{ end -}}
{{- with .Values.kafka.tls.clientSecret }}{{ $files = append $files (dict "secret" . "key" "tls.crt" "file" "kafka-client.crt") }}{{ $files = append $files (dict "secret" . "key" "tls.key" "file" "kafka-client.key") }}{{ end -}}
{{- toJson $files -}}
{{- end -}}

{{/*
The connector's config file: .Values.config, under the keys the chart owns.
A secret in the values is refused: it would land in the ConfigMap.
*/}}
{{- define "outbox-cdc.config" -}}
{{- $url := required "postgres.url is required: --set postgres.url=postgres://cdc@host:5432/app (the password goes in postgres.passwordSecret)" .Values.postgres.url -}}
{{- if regexMatch "^[a-z]+://[^/@]*:[^/@]*@" $url -}}
{{- fail "postgres.url holds a password, which would land in the ConfigMap: put it in a Secret and set postgres.passwordSecret.name" -}}
{{- end -}}
{{- if regexMatch "(^|[?&\\s])password=" $url -}}
{{- fail "postgres.url holds a password parameter, which would land in the ConfigMap: put it in a Secret and set postgres.passwordSecret.name" -}}
{{- end -}}
{{- if not .Values.kafka.brokers -}}
{{- fail "kafka.brokers is required: --set 'kafka.brokers={kafka-0:9092,kafka-1:9092}'" -}}
{{- end -}}
{{- $c := deepCopy (.Values.config | default dict) -}}
{{- $ck := get $c "kafka" | default dict -}}
{{- if get (get $ck "sasl" | default dict) "password" -}}
{{- fail "config.kafka.sasl.password would land in the ConfigMap: put it in a Secret and set kafka.sasl.passwordSecret.name" -}}
{{- end -}}
{{- $sr := get $c "schema_registry" | default dict -}}
{{- if get (get $sr "basic_auth" | default dict) "password" -}}
{{- fail "config.schema_registry.basic_auth.password would land in the ConfigMap: put it in a Secret and set schemaRegistry.passwordSecret.name" -}}
{{- end -}}
{{- if get (get $c "http" | default dict) "token" -}}
{{- fail "config.http.token would land in the ConfigMap: put it in a Secret and set metrics.tokenSecret.name" -}}
{{- end -}}
{{- $secrets := include "outbox-cdc.secretFiles" . | fromJsonArray -}}
{{- $has := dict -}}
{{- range $secrets }}{{ $_ := set $has .file true }}{{ end -}}
{{- $pg := dict "url" $url -}}
{{- /* Each release its own slot: two releases on one server must not share one. */ -}}
{{- $_ := set $pg "slot" (.Values.postgres.slot | default (regexReplaceAll "[^a-z0-9_]" (lower .Release.Name) "_" | trunc 63)) -}}
{{- with .Values.postgres.publication }}{{ $_ := set $pg "publication" . }}{{ end -}}
{{- if hasKey $has "postgres-password" }}{{ $_ := set $pg "password_file" "/etc/cdc/secrets/postgres-password" }}{{ end -}}
{{- $_ := set $c "postgres" (mergeOverwrite (get $c "postgres" | default dict) $pg) -}}
{{- $k := dict "brokers" .Values.kafka.brokers -}}
{{- if .Values.kafka.tls.enabled -}}
{{- $tls := dict "enabled" true -}}
{{- if .Values.kafka.tls.caSecret.name }}{{ $_ := set $tls "ca_file" "/etc/cdc/tls/kafka-ca.crt" }}{{ end -}}
{{- if .Values.kafka.tls.clientSecret }}{{ $_ := set $tls "cert_file" "/etc/cdc/tls/kafka-client.crt" }}{{ $_ := set $tls "key_file" "/etc/cdc/tls/kafka-client.key" }}{{ end -}}
{{- $_ := set $k "tls" $tls -}}
{{- end -}}
{{- with .Values.kafka.sasl.mechanism -}}
{{- $sasl := dict "mechanism" . -}}
{{- with $.Values.kafka.sasl.username }}{{ $_ := set $sasl "username" . }}{{ end -}}
{{- if hasKey $has "kafka-sasl-password" }}{{ $_ := set $sasl "password_file" "/etc/cdc/secrets/kafka-sasl-password" }}{{ end -}}
{{- if hasKey $has "kafka-sasl-token" }}{{ $_ := set $sasl "token_file" "/etc/cdc/secrets/kafka-sasl-token" }}{{ end -}}
{{- $_ := set $k "sasl" $sasl -}}
{{- end -}}
{{- $_ := set $c "kafka" (mergeOverwrite $ck $k) -}}
{{- if hasKey $has "schema-registry-password" }}{{ $_ := set $sr "basic_auth" (mergeOverwrite (get $sr "basic_auth" | default dict) (dict "password_file" "/etc/cdc/secrets/schema-registry-password")) }}{{ end -}}
{{- if hasKey $has "schema-registry-token" }}{{ $_ := set $sr "token_file" "/etc/cdc/secrets/schema-registry-token" }}{{ end -}}
{{- if .Values.schemaRegistry.caSecret.name }}{{ $_ := set $sr "tls" (mergeOverwrite (get $sr "tls" | default dict) (dict "ca_file" "/etc/cdc/tls/schema-registry-ca.crt")) }}{{ end -}}
{{- if $sr }}{{ $_ := set $c "schema_registry" $sr }}{{ end -}}
{{- $cp := get $c "checkpoint" | default dict -}}
{{- with .Values.checkpoint.topic }}{{ $_ := set $cp "topic" . }}{{ end -}}
{{- if hasKey $has "signing-key" }}{{ $_ := set $cp "signing_key_file" "/etc/cdc/secrets/signing-key" }}{{ end -}}
{{- if $cp }}{{ $_ := set $c "checkpoint" $cp }}{{ end -}}
{{- $http := get $c "http" | default dict -}}
{{- $_ := set $http "listen" (printf "0.0.0.0:%v" .Values.metrics.port) -}}
{{- if hasKey $has "metrics-token" }}{{ $_ := set $http "token_file" "/etc/cdc/secrets/metrics-token" }}{{ end -}}
{{- $_ := set $c "http" $http -}}
{{- $_ := set $c "name" (include "outbox-cdc.pipeline" .) -}}
{{- $_ := set $c "shutdown_timeout" (printf "%ds" (int .Values.shutdownTimeoutSeconds)) -}}
{{- toYaml $c -}}
{{- end -}}

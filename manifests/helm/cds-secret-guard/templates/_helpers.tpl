{{/*
Name of every object of the release: the release name when it already says
cds-secret-guard, else <release>-cds-secret-guard.
*/}}
{{- define "cds-secret-guard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cds-secret-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The labels of a hook Job's pod (the component named by the argument): not the guard's,
so that neither its Service, its PodDisruptionBudget nor its NetworkPolicy takes the
Job's pod for a replica.
*/}}
{{- define "cds-secret-guard.jobSelectorLabels" -}}
app.kubernetes.io/name: {{ .context.Chart.Name }}-{{ .component }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "cds-secret-guard.labels" -}}
{{ include "cds-secret-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The secret holding tls.crt and tls.key. */}}
{{- define "cds-secret-guard.tlsSecretName" -}}
{{- if eq .Values.certificate.source "secret" -}}
{{- required "certificate.secret.name is required with certificate.source=secret" .Values.certificate.secret.name -}}
{{- else -}}
{{- include "cds-secret-guard.fullname" . }}-tls
{{- end -}}
{{- end -}}

{{/* A CEL string literal, as `cds-secret-guard webhooks` quotes it. */}}
{{- define "cds-secret-guard.celString" -}}
'{{ . | replace "\\" "\\\\" | replace "'" "\\'" }}'
{{- end -}}

{{/* A CEL list of string literals. */}}
{{- define "cds-secret-guard.celList" -}}
{{- $items := list -}}
{{- range . -}}
{{- $items = append $items (include "cds-secret-guard.celString" .) -}}
{{- end -}}
[{{ join ", " $items }}]
{{- end -}}

{{/*
The match condition leaving out exempt requesters: the same expression as
`cds-secret-guard webhooks --exempt-user ... --exempt-group ...` (a test compares them).
*/}}
{{- define "cds-secret-guard.notExempt" -}}
{{- $terms := list -}}
{{- with .Values.exemptions.users -}}
{{- $terms = append $terms (printf "!(request.userInfo.username in %s)" (include "cds-secret-guard.celList" .)) -}}
{{- end -}}
{{- with .Values.exemptions.groups -}}
{{- $terms = append $terms (printf "!(has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in %s))" (include "cds-secret-guard.celList" .)) -}}
{{- end -}}
{{- join " && " $terms -}}
{{- end -}}

{{/* Both webhooks see the protected namespaces, or all but kube-system and ours. */}}
{{- define "cds-secret-guard.namespaceSelector" -}}
matchExpressions:
- key: kubernetes.io/metadata.name
{{- if .Values.namespaces }}
  operator: In
  values:
  {{- toYaml .Values.namespaces | nindent 2 }}
{{- else }}
  operator: NotIn
  values:
  - kube-system
  - {{ .Release.Namespace }}
{{- end }}
{{- end -}}

{{/* Names: <release>-holmes, or the release name when it already contains the chart name. */}}
{{- define "holmes.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "holmes.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "holmes.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "holmes.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: holmes
{{- end -}}

{{- define "holmes.selectorLabels" -}}
app.kubernetes.io/name: {{ include "holmes.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "holmes.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "holmes.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag or repository@digest; the tag defaults to the chart's appVersion. */}}
{{- define "holmes.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (default .appVersion .tag) -}}
{{- end -}}
{{- end -}}

{{- define "holmes.operatorImage" -}}
{{- include "holmes.image" (merge (dict "appVersion" .Chart.AppVersion) .Values.image) -}}
{{- end -}}

{{- define "holmes.trainerImage" -}}
{{- include "holmes.image" (merge (dict "appVersion" .Chart.AppVersion) .Values.trainer.image) -}}
{{- end -}}

{{/* The namespaces the operator serves when not cluster-wide. */}}
{{- define "holmes.watchNamespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- toJson .Values.watch.namespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{/* The NIC labeller DaemonSet's names and labels (component nic-labeller). */}}
{{- define "holmes.labellerName" -}}
{{- printf "%s-labeller" (include "holmes.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "holmes.labellerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "holmes.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: nic-labeller
{{- end -}}

{{- define "holmes.labellerLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "holmes.labellerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: holmes
{{- end -}}

{{/* The labeller's namespace: its own (labeller.namespace.name) unless that is "", then the
release's. Its hostPath volumes need Pod Security "privileged" there. */}}
{{- define "holmes.labellerNamespace" -}}
{{- default .Release.Namespace .Values.labeller.namespace.name -}}
{{- end }}

{{- define "holmes.labellerServiceAccountName" -}}
{{- if .Values.labeller.serviceAccount.create -}}
{{- default (include "holmes.labellerName" .) .Values.labeller.serviceAccount.name -}}
{{- else -}}
{{- required "labeller.serviceAccount.name is required when labeller.serviceAccount.create is false" .Values.labeller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An address as a URL's host: an IPv6 literal in brackets ([::]), anything else as it is.
*/}}
{{- define "holmes.urlHost" -}}
{{- if contains ":" . }}[{{ . }}]{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* The objects' namespace: .Values.namespace, else the release's. */}}
{{- define "raygpu.namespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The sidecar's ServiceAccount, Role and RoleBinding name: fullnameOverride, else raygpu-sidecar[<nameSuffix>].
     values.schema.json keeps fullnameOverride raygpu-sidecar or raygpu-sidecar-<...>: the admission policies
     know the sidecar by that ServiceAccount name. */}}
{{- define "raygpu.sidecarName" -}}
{{- .Values.fullnameOverride | default (printf "raygpu-sidecar%s" .Values.nameSuffix) -}}
{{- end -}}

{{/* app.kubernetes.io/name's stem: nameOverride, else raygpu. */}}
{{- define "raygpu.name" -}}
{{- .Values.nameOverride | default "raygpu" -}}
{{- end -}}

{{/* The labels Helm charts carry (KubeRay's, Kueue's): chart, instance, version, managed-by. */}}
{{- define "raygpu.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The RayCluster's name; values.schema.json refuses an empty or invalid one, this says what to do. */}}
{{- define "raygpu.cluster" -}}
{{- required "set cluster: the name of the RayCluster the sidecar runs in (helm install ... --set cluster=<name>)" .Values.cluster -}}
{{- end -}}

{{/* The sidecar image: repository:tag, tag defaulting to the chart's appVersion (<raygpu version>-ray<Ray version>). */}}
{{- define "raygpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The labels the kustomize bases add (labels: ... includeSelectors: false), and Helm's: the objects compare
     equal but for Helm's labels. */}}
{{- define "raygpu.sidecarLabels" -}}
app.kubernetes.io/name: {{ include "raygpu.name" . }}-sidecar
app.kubernetes.io/part-of: raygpu
{{ include "raygpu.helmLabels" . }}
{{- end -}}

{{/* The head pod's part that runs the sidecar (deploy/examples/raycluster-with-sidecar.yaml): the pod
     does not automount a token; the projected volume gives what the automount would, and only the
     raygpu-sidecar container mounts it. Used by raycluster.yaml and NOTES.txt. */}}
{{- define "raygpu.headPodSidecarFields" -}}
serviceAccountName: {{ include "raygpu.sidecarName" . }}
automountServiceAccountToken: false
volumes:
  - name: raygpu-sidecar-token
    projected:
      defaultMode: 420
      sources:
        - serviceAccountToken:
            path: token
            expirationSeconds: 3607
        - configMap:
            name: kube-root-ca.crt
            items:
              - {key: ca.crt, path: ca.crt}
        - downwardAPI:
            items:
              - path: namespace
                fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}
  - name: raygpu-sidecar-tmp
    emptyDir: {sizeLimit: 1Gi}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "raygpu.sidecarContainer" -}}
- name: raygpu-sidecar
  image: {{ include "raygpu.image" . }}
  {{- with .Values.image.pullPolicy }}
  imagePullPolicy: {{ . }}
  {{- end }}
  command: ["raygpu", "sidecar"]
  args:
    {{- range .Values.rayCluster.sidecar.args }}
    - {{ . | quote }}
    {{- end }}
    - {{ printf "--metrics-port=%d" (int .Values.metrics.port) | quote }}
  env:
    - name: RAYGPU_CLUSTER
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['ray.io/cluster']
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: RAY_ADDRESS
      value: "127.0.0.1:6379"
  {{- if .Values.metrics.port }}
  ports:
    - name: raygpu-metrics
      containerPort: {{ int .Values.metrics.port }}
  readinessProbe:
    httpGet: {path: /metrics, port: raygpu-metrics}
    periodSeconds: 10
  livenessProbe:
    httpGet: {path: /metrics, port: raygpu-metrics}
    initialDelaySeconds: 30
    periodSeconds: 20
    failureThreshold: 6
  {{- end }}
  resources:
    {{- toYaml .Values.rayCluster.sidecar.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities: {drop: ["ALL"]}
    runAsNonRoot: true
    readOnlyRootFilesystem: true
    seccompProfile: {type: RuntimeDefault}
  volumeMounts:
    - name: raygpu-sidecar-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    - name: raygpu-sidecar-tmp
      mountPath: /tmp
{{- end -}}

{{/* The driver's ServiceAccount, Role and RoleBinding name: raygpu-driver[<nameSuffix>], or fullnameOverride
     with raygpu-sidecar replaced by raygpu-driver. */}}
{{- define "raygpu.driverName" -}}
{{- if .Values.fullnameOverride -}}
{{- printf "raygpu-driver%s" (trimPrefix "raygpu-sidecar" .Values.fullnameOverride) -}}
{{- else -}}
{{- printf "raygpu-driver%s" .Values.nameSuffix -}}
{{- end -}}
{{- end -}}

{{/* The labels of the kustomize base deploy/driver, and Helm's. */}}
{{- define "raygpu.driverLabels" -}}
app.kubernetes.io/name: {{ include "raygpu.name" . }}-driver
app.kubernetes.io/part-of: raygpu
{{ include "raygpu.helmLabels" . }}
{{- end -}}

{{/* The keep-warm state ConfigMap's name, as raygpu.model.labels.warm_state_name computes it: <cluster>-raygpu-warm
     when that is a DNS label of at most 63 characters, else the cleaned name cut to fit, "--" and 8 hex of the
     SHA-256 of the JSON list [cluster, "warm"] (a name with dots, or of 52 characters and more). */}}
{{- define "raygpu.warmStateName" -}}
{{- $cluster := include "raygpu.cluster" . -}}
{{- $plain := printf "%s-raygpu-warm" $cluster -}}
{{- if and (regexMatch "^[a-z0-9-]+$" $cluster) (eq (trimAll "-" (regexReplaceAll "-+" $cluster "-")) $cluster) (le (len $plain) 63) -}}
{{- $plain -}}
{{- else -}}
{{- $clean := trimAll "-" (regexReplaceAll "-+" (regexReplaceAll "[^a-z0-9-]+" (lower $cluster) "-") "-") -}}
{{- $head := printf "%s-raygpu-warm" $clean -}}
{{- $head = trimAll "-" (trunc 53 $head) | default "rg" -}}
{{- printf "%s--%s" $head (trunc 8 (sha256sum (printf "[%s, \"warm\"]" (toJson $cluster)))) -}}
{{- end -}}
{{- end -}}

{{/* Monitoring (templates/monitoring-*.yaml, docs/monitoring.md): the labels of its objects, and a check that
     something to scrape exists. */}}
{{- define "raygpu.monitoringLabels" -}}
{{ include "raygpu.sidecarLabels" . }}
app.kubernetes.io/component: metrics
{{- end -}}

{{- define "raygpu.needsMetricsPort" -}}
{{- if not (int .Values.metrics.port) -}}
{{- fail (printf "%s scrapes the sidecar's /metrics: set metrics.port (it is 0, which turns /metrics off)" .what) -}}
{{- end -}}
{{- end -}}

{{/* The objects of a deploy/ file copied into files/ (deploy/monitoring/sync-chart-files.sh), each with the
     chart's labels added to its own: (dict "ctx" $ "file" "files/<name>.yaml"). */}}
{{- define "raygpu.filesObjects" -}}
{{- $labels := dict "app.kubernetes.io/part-of" "raygpu" | merge (include "raygpu.helmLabels" .ctx | fromYaml) }}
{{- range $doc := splitList "\n---" (.ctx.Files.Get .file) }}
{{- $obj := $doc | fromYaml }}
{{- if $obj.kind }}
{{- $_ := set $obj.metadata "labels" (merge ($obj.metadata.labels | default dict) $labels) }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end -}}

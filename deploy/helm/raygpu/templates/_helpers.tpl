{{/* The objects' namespace: .Values.namespace, else the release's. */}}
{{- define "raygpu.namespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The sidecar's ServiceAccount, Role and RoleBinding name: raygpu-sidecar[<nameSuffix>]. */}}
{{- define "raygpu.sidecarName" -}}
{{- printf "raygpu-sidecar%s" .Values.nameSuffix -}}
{{- end -}}

{{/* The RayCluster's name; values.schema.json refuses an empty or invalid one, this says what to do. */}}
{{- define "raygpu.cluster" -}}
{{- required "set cluster: the name of the RayCluster the sidecar runs in (helm install ... --set cluster=<name>)" .Values.cluster -}}
{{- end -}}

{{/* The sidecar image: repository:tag, tag defaulting to the chart's appVersion (<raygpu version>-ray<Ray version>). */}}
{{- define "raygpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The labels the kustomize bases add (labels: ... includeSelectors: false): the objects compare equal. */}}
{{- define "raygpu.sidecarLabels" -}}
app.kubernetes.io/name: raygpu-sidecar
app.kubernetes.io/part-of: raygpu
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
  {{- end }}
  resources:
    {{- toYaml .Values.rayCluster.sidecar.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    capabilities: {drop: ["ALL"]}
  volumeMounts:
    - name: raygpu-sidecar-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
{{- end -}}

{{/* The driver's ServiceAccount, Role and RoleBinding name: raygpu-driver[<nameSuffix>]. */}}
{{- define "raygpu.driverName" -}}
{{- printf "raygpu-driver%s" .Values.nameSuffix -}}
{{- end -}}

{{/* The labels of the kustomize base deploy/driver. */}}
{{- define "raygpu.driverLabels" -}}
app.kubernetes.io/name: raygpu-driver
app.kubernetes.io/part-of: raygpu
{{- end -}}

{{/* Monitoring (templates/monitoring-*.yaml, docs/monitoring.md): the labels of its objects, and a check that
     something to scrape exists. */}}
{{- define "raygpu.monitoringLabels" -}}
{{ include "raygpu.sidecarLabels" . }}
app.kubernetes.io/component: metrics
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raygpu.needsMetricsPort" -}}
{{- if not (int .Values.metrics.port) -}}
{{- fail (printf "%s scrapes the sidecar's /metrics: set metrics.port (it is 0, which turns /metrics off)" .what) -}}
{{- end -}}
{{- end -}}

// The Python side of the serving front ends: ServingFrontEnd (made from a
// ServingQueue and the plan paddle_ipu/serving/http.py writes), GrpcInferCall, and
// kserve_datatypes (the datatype table of dtypes.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../core/bindings.h"
#include "front_end.h"
#include "grpc_call.h"
#include "metadata.h"
#include "requests.h"
#include "text.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace serving {

namespace {

TensorPlan TensorFrom(const py::dict& d) {
  TensorPlan t;
  t.name = d["name"].cast<std::string>();
  const std::string dt = d["datatype"].cast<std::string>();
  t.dtype = FromV2(dt);
  if (t.dtype == DType::kInvalid) throw py::value_error("unknown KServe datatype " + dt);
  t.shape = d["shape"].cast<std::vector<int64_t>>();
  t.unit_bytes = d["unit_bytes"].cast<int64_t>();
  t.unit_elems = t.unit_bytes / ElemSize(t.dtype);
  if (d.contains("ranges")) {
    for (const py::handle h : d["ranges"]) {
      const py::dict r = h.cast<py::dict>();
      IndexRange b;
      b.low = r["low"].cast<int64_t>();
      b.high = r["high"].cast<int64_t>();
      b.allowed = r["allowed"].cast<std::vector<int64_t>>();
      b.column = r["column"].is_none() ? -1 : r["column"].cast<int64_t>();
      b.describe = r["describe"].cast<std::string>();
      t.ranges.push_back(std::move(b));
    }
  }
  return t;
}

ModelPlan PlanFrom(const py::dict& d) {
  ModelPlan m;
  m.name = d["name"].cast<std::string>();
  m.version = d["version"].cast<std::string>();
  m.server_version = d["server_version"].cast<std::string>();
  m.auto_batch = d["auto_batch"].cast<bool>();
  m.max_rows = d["max_rows"].cast<int64_t>();
  m.capacity = d["capacity"].cast<int64_t>();
  m.limit = d["limit"].cast<int64_t>();
  m.micro_batch_size = d["micro_batch_size"].cast<int64_t>();
  m.batch_timeout_us = d["batch_timeout_us"].cast<double>();
  m.request_timeout_s = d["request_timeout_s"].cast<double>();
  m.max_body = d["max_body"].cast<int64_t>();
  if (d.contains("instance_count")) m.instance_count = d["instance_count"].cast<int64_t>();
  if (d.contains("instance_kind")) m.instance_kind = d["instance_kind"].cast<std::string>();
  for (const py::handle h : d["inputs"]) m.inputs.push_back(TensorFrom(h.cast<py::dict>()));
  for (const py::handle h : d["outputs"]) m.outputs.push_back(TensorFrom(h.cast<py::dict>()));
  return m;
}

py::tuple ParsedTuple(const ModelPlan& m, const Error& e, const InferRequest& r) {
  if (e) return py::make_tuple(e.status, ValidUtf8(e.message), py::none());
  py::list inputs;
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    inputs.append(py::bytes(r.in[k], static_cast<size_t>(r.units * m.inputs[k].unit_bytes)));
  }
  py::dict out;
  out["units"] = r.units;
  out["rows"] = r.rows;
  out["inputs"] = inputs;
  out["want"] = r.want;
  out["binary"] = std::vector<bool>(r.binary.begin(), r.binary.end());
  out["id"] = r.id;
  out["timeout_s"] = r.timeout_s;
  return py::make_tuple(0, std::string(), out);
}

py::tuple Datatypes() {
  py::tuple rows(kDTypeCount);
  for (int i = 0; i < kDTypeCount; ++i) {
    const DTypeInfo& t = Info(static_cast<DType>(i));
    rows[static_cast<size_t>(i)] = py::make_tuple(t.v2, t.numpy, t.size);
  }
  return rows;
}

}  // namespace

void RegisterServing(py::module_& m) {
  m.def("kserve_datatypes", &Datatypes,
        "The KServe v2 datatypes a served model's tensors may have, one row each:\n"
        "(v2 name, numpy dtype name, item size in bytes), e.g. ('FP32', 'float32', 4).");

  py::class_<GrpcCall, std::shared_ptr<GrpcCall>>(
      m, "GrpcInferCall", "A ModelInfer call in the serving queue (made by ServingFrontEnd.grpc_infer).")
      .def(
          "result",
          [](GrpcCall& c, double timeout, FrontEnd& fe) -> py::tuple {
            int code;
            {
              py::gil_scoped_release nogil;
              code = c.Result(&fe, timeout);
            }
            if (code == 0) return py::make_tuple(0, py::bytes(c.response()));
            return py::make_tuple(code, py::str(c.message()));
          },
          py::arg("timeout"), py::arg("front_end"),
          "Wait for the answer (without the GIL); a request not started within timeout\n"
          "seconds (> 0) is taken out of the queue. (0, response bytes) or (gRPC code, message).")
      .def(
          "cancel", [](GrpcCall& c, FrontEnd& fe) { return c.Cancel(fe.counters()); },
          py::arg("front_end"), "Drop the request if it has not started (the client went away).");

  py::class_<FrontEnd>(m, "ServingFrontEnd",
                       "The KServe v2 front ends over a ServingQueue: HTTP (Boost.Beast) and the\n"
                       "gRPC ModelInfer path; requests never touch Python (see csrc/serving).")
      .def(py::init([](py::object queue, const py::dict& plan) {
             return std::make_unique<FrontEnd>(queue, PlanFrom(plan));
           }),
           py::arg("queue"), py::arg("plan"))
      .def("start_http", &FrontEnd::StartHttp, py::arg("host"), py::arg("port"),
           py::arg("threads") = 1, py::arg("reuse_port") = false,
           py::call_guard<py::gil_scoped_release>(),
           "Listen on host:port with `threads` IO threads; returns the port.")
      .def("stop_accepting", &FrontEnd::StopAccepting,
           "Drain: close the listening sockets and idle connections; answer what is in flight.")
      .def("drain", &FrontEnd::Drain, py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
           "Wait until every admitted request is answered and every connection closed;\n"
           "False on timeout (negative: no limit).")
      .def("shutdown", &FrontEnd::Shutdown, py::call_guard<py::gil_scoped_release>())
      .def("set_ready", &FrontEnd::set_ready, py::arg("ready"))
      .def_property_readonly("ready", &FrontEnd::ready)
      .def_property_readonly("active", [](FrontEnd& f) { return f.active.load(); })
      .def(
          "grpc_infer",
          [](FrontEnd& f, py::bytes msg, std::string traceparent) {
            std::string data = msg;  // a copy: no Python object stays with the request
            py::gil_scoped_release nogil;
            return f.GrpcInfer(std::move(data), std::move(traceparent));
          },
          py::arg("message"), py::arg("traceparent") = std::string(),
          "Parse, check and queue a serialized ModelInferRequest (traceparent: the\n"
          "call's W3C trace context, for the access log).")
      .def("open_access_log", &FrontEnd::OpenAccessLog, py::arg("path"),
           "Write one JSON line per inference request to path ('-': standard error).")
      .def("flush_access_log", [](FrontEnd& f) { f.FlushAccessLog(); },
           py::call_guard<py::gil_scoped_release>())
      .def("server_metadata_json", [](FrontEnd& f) { return f.server_metadata(); })
      .def("metadata_json", [](FrontEnd& f) { return f.metadata(); })
      .def("config_json", [](FrontEnd& f) { return f.config(); })
      .def("index_json", [](FrontEnd& f) { return RepositoryIndexJson(f.plan(), f.ready()); })
      .def("stats_json", &FrontEnd::StatisticsJson)
      .def("prometheus", &FrontEnd::Prometheus)
      .def(
          "parse_http",
          [](FrontEnd& f, py::bytes head, py::bytes blob) {
            const std::string h = head, b = blob;
            InferRequest r;
            const Error e = ParseHttpInfer(f.plan(), h, b, &r);
            return ParsedTuple(f.plan(), e, r);
          },
          py::arg("head"), py::arg("blob") = py::bytes(),
          "Parse and check an HTTP infer request without queueing it (for tests):\n"
          "(0, '', dict) or (HTTP status, message, None).")
      .def(
          "parse_grpc",
          [](FrontEnd& f, py::bytes msg) {
            const std::string s = msg;
            InferRequest r;
            const Error e = ParseGrpcInfer(f.plan(), s, &r);
            return ParsedTuple(f.plan(), e, r);
          },
          py::arg("message"), "As parse_http, for a serialized ModelInferRequest.");
}

}  // namespace serving
}  // namespace paddle_ipu

// The report's two plots as SVG, written directly: the plot must exist even
// where no plotting program is installed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "sluice/doctor/report.hpp"

namespace sluice::doctor {

namespace {

constexpr double kWidth = 640;
constexpr double kHeight = 400;
constexpr double kLeft = 70;
constexpr double kRight = 20;
constexpr double kTop = 40;
constexpr double kBottom = 50;

std::string num(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A "nice" step (1, 2 or 5 times a power of ten) giving about five ticks.
double tick_step(double span) {
  if (span <= 0) return 1;
  const double raw = span / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= factor * power) return factor * power;
  }
  return 10 * power;
}

// A plot area with linear axes from 0 to the data's maximum.
class Canvas {
 public:
  Canvas(const std::string& title, const std::string& x_label, const std::string& y_label,
         double x_max, double y_max)
      : x_max_(x_max > 0 ? x_max : 1), y_max_(y_max > 0 ? y_max : 1) {
    x_step_ = tick_step(x_max_);
    y_step_ = tick_step(y_max_);
    x_max_ = std::ceil(x_max_ / x_step_) * x_step_;
    y_max_ = std::ceil(y_max_ / y_step_) * y_step_;
    out_ =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
        num(kWidth) + "\" height=\"" + num(kHeight) + "\" viewBox=\"0 0 " + num(kWidth) + " " +
        num(kHeight) +
        "\" font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    text(kWidth / 2, 22, title, "middle", 14);
    text(kLeft + plot_width() / 2, kHeight - 10, x_label, "middle");
    out_ += "<text x=\"16\" y=\"" + num(kTop + plot_height() / 2) +
            "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " + num(kTop + plot_height() / 2) +
            ")\">" + escape(y_label) + "</text>\n";
    for (double x = 0; x <= x_max_ + x_step_ / 2; x += x_step_) {
      line(x, 0, x, y_max_, "#ddd");
      text(px(x), kTop + plot_height() + 16, label(x), "middle");
    }
    for (double y = 0; y <= y_max_ + y_step_ / 2; y += y_step_) {
      line(0, y, x_max_, y, "#ddd");
      text(kLeft - 6, py(y) + 4, label(y), "end");
    }
    out_ += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(plot_width()) +
            "\" height=\"" + num(plot_height()) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  }

  void line(double x1, double y1, double x2, double y2, const char* colour, double width = 1) {
    out_ += "<line x1=\"" + num(px(x1)) + "\" y1=\"" + num(py(y1)) + "\" x2=\"" + num(px(x2)) +
            "\" y2=\"" + num(py(y2)) + "\" stroke=\"" + colour + "\" stroke-width=\"" + num(width) +
            "\"/>\n";
  }
  void point(double x, double y, const char* colour, double radius = 3) {
    out_ += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"" + num(radius) +
            "\" fill=\"" + colour + "\"/>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& points, const char* colour) {
    out_ += "<polyline fill=\"none\" stroke=\"";
    out_ += colour;
    out_ += "\" stroke-width=\"2\" points=\"";
    for (const auto& [x, y] : points) out_ += num(px(x)) + "," + num(py(y)) + " ";
    out_ += "\"/>\n";
  }
  void text(double x, double y, const std::string& content, const char* anchor, int size = 12) {
    out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor +
            "\" font-size=\"" + std::to_string(size) + "\">" + escape(content) + "</text>\n";
  }
  void legend(int row, const char* colour, const std::string& content) {
    const double y = kTop + 14 + row * 16;
    out_ += "<rect x=\"" + num(kLeft + 10) + "\" y=\"" + num(y - 9) +
            "\" width=\"10\" height=\"10\" fill=\"" + colour + "\"/>\n";
    text(kLeft + 26, y, content, "start");
  }
  double x_max() const { return x_max_; }
  std::string finish() { return out_ + "</svg>\n"; }

 private:
  static double plot_width() { return kWidth - kLeft - kRight; }
  static double plot_height() { return kHeight - kTop - kBottom; }
  double px(double x) const { return kLeft + x / x_max_ * plot_width(); }
  double py(double y) const {
    return kTop + plot_height() - std::min(y, y_max_) / y_max_ * plot_height();
  }
  static std::string label(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", value);
    return text;
  }

  double x_max_;
  double y_max_;
  double x_step_ = 1;
  double y_step_ = 1;
  std::string out_;
};

}  // namespace

std::string prompt_length_svg(const DeploymentReport& report) {
  double x_max = 0;
  double y_max = 0;
  for (const auto& sample : report.prompt_samples) {
    x_max = std::max(x_max, sample.tokens);
    y_max = std::max(y_max, sample.ttft_ms);
  }
  const auto* prefill = report.prefill ? &*report.prefill : nullptr;
  if (prefill && prefill->fit.valid) y_max = std::max(y_max, prefill->fit.predict(x_max));
  Canvas canvas("TTFT against prompt length: " + report.deployment, "prompt tokens", "TTFT (ms)",
                x_max, y_max * 1.1);
  for (const auto& sample : report.prompt_samples) {
    canvas.point(sample.tokens, sample.ttft_ms, "#1f77b4");
  }
  canvas.legend(0, "#1f77b4", "measured TTFT");
  if (prefill && prefill->fit.valid) {
    const auto& fit = prefill->fit;
    canvas.polyline({{0, std::max(0.0, fit.predict(0))}, {x_max, fit.predict(x_max)}}, "#d62728");
    char text[96];
    std::snprintf(text, sizeof text, "fit: %.1f ms per 1k tokens + %.1f ms, R² %.2f",
                  fit.ms_per_1k_tokens(), fit.intercept_ms, fit.r_squared);
    canvas.legend(1, "#d62728", text);
  }
  return canvas.finish();
}

std::string concurrency_svg(const DeploymentReport& report) {
  double x_max = 0;
  double y_max = 0;
  if (report.queueing) {
    for (const auto& level : report.queueing->levels) {
      x_max = std::max(x_max, static_cast<double>(level.concurrency));
      y_max = std::max(y_max, level.ttft.p95);
    }
  }
  Canvas canvas("TTFT against concurrency: " + report.deployment, "concurrent requests",
                "TTFT (ms)", x_max, y_max * 1.1);
  if (report.queueing) {
    std::vector<std::pair<double, double>> medians;
    for (const auto& level : report.queueing->levels) {
      const double x = level.concurrency;
      canvas.line(x, level.ttft.median, x, level.ttft.p95, "#555", 1.5);
      canvas.line(x - x_max / 80, level.ttft.p95, x + x_max / 80, level.ttft.p95, "#555", 1.5);
      medians.emplace_back(x, level.ttft.median);
    }
    canvas.polyline(medians, "#1f77b4");
    for (const auto& [x, y] : medians) canvas.point(x, y, "#1f77b4", 4);
    canvas.legend(0, "#1f77b4", "median TTFT");
    canvas.legend(1, "#555", "whisker: P95");
    if (report.queueing->knee) {
      const double knee = *report.queueing->knee;
      canvas.line(knee, 0, knee, y_max * 1.1, "#d62728");
      canvas.legend(2, "#d62728", "knee: " + std::to_string(*report.queueing->knee));
    }
  }
  return canvas.finish();
}

}  // namespace sluice::doctor
